"""Compute-time profiles: how long one batch of a model takes on one GPU type.

The only measured anchor we use is NVIDIA's published ResNet-50 v1.5 inference latency on one
V100 16 GB (PyTorch, FP32, NGC 21.03 container; NVIDIA/DeepLearningExamples,
PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Inference performance: NVIDIA DGX-1
(1x V100 16GB)", average latency): batch 1 10.37 ms, 2 10.24, 4 10.46, 8 11.5, 16 16.07,
32 29.37 ms. Every other model is **scaled from that anchor by its forward-pass GFLOPs per
sample** (a stated method, not a measurement): ``t(model, b) = t_resnet50(b * gflops / 4.1)``,
interpolated linearly in batch; below one ResNet-50 sample's worth of work the batch-1 latency is
scaled down by the same FLOPs ratio (a light pre-processing kernel does not cost a whole ResNet-50).

Other GPU types scale by a single ratio against V100 FP32:
- A100: 2.56x faster, the ratio of the same README's single-GPU training throughputs
  (938 img/s TF32 on A100 80 GB vs 367 img/s FP32 on V100 16 GB).
- A10: taken equal to V100 (our assumption; its FP32 peak is higher, its memory bandwidth lower).
- H100: 2x A100 (our assumption until issue 5 measures it on the lent machine).
CPU functions take a fixed time per request, our assumption, stated per function name (``CPU_MS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

#: Anchor (batch size, ms) from the NVIDIA README cited above.
RESNET50_V100_MS: tuple[tuple[int, float], ...] = (
    (1, 10.37), (2, 10.24), (4, 10.46), (8, 11.5), (16, 16.07), (32, 29.37), (64, 55.4), (128, 109.26),
)
RESNET50_GFLOPS = 4.1

#: Forward GFLOPs per sample (multiply-adds x 2 as usually quoted), with where the number comes from.
MODEL_GFLOPS: dict[str, tuple[float, str]] = {
    "resnet50": (4.1, "He et al. 2016, 224x224"),
    "resnet101": (7.8, "He et al. 2016, 224x224"),
    "alexnet": (0.72, "torchvision model card, 224x224"),
    "yolo-det": (16.5, "YOLOv5s at 640x640, ultralytics model table"),
    "yolo-seg": (26.4, "YOLOv5s-seg at 640x640, ultralytics model table"),
    "yolo-face": (16.5, "YOLOv5s-sized face detector at 640x640 (assumed equal to yolo-det)"),
    "denoise": (8.0, "a small DnCNN-style network at 640x640 (our assumption)"),
    "preproc": (0.5, "resize + normalise on the GPU, CV-CUDA style (our assumption)"),
    "colour": (0.3, "colour mapping of a segmentation mask (our assumption)"),
    "ocr": (6.0, "CRNN-style text recogniser (our assumption)"),
    "bert": (22.0, "BERT-base at sequence length 128: 2 x 110 M params x 128 tokens / 1.28 (approx.)"),
}

#: Fixed CPU function times per request in ms, by the specs' function names (our assumptions; CPU
#: functions run on the host without contention, so these only add to latency).
CPU_MS: dict[str, float] = {
    "decode": 4.0,       # traffic: keep every 2nd frame as float32
    "preprocess": 2.0,   # traffic: resize + normalise to the detector's input
    "denoise": 4.0,      # driving (median filter), image (Gaussian blur)
    "colour": 2.0,       # driving: argmax + palette blend
    "split": 0.5,        # video: four chunks by reference, no copy
    "ocr": 4.0,          # social: projection-profile OCR
    "aggregate": 0.5,    # image: mean of three softmaxes
    "postproc": 0.5,
}

#: GPU memory bandwidth in GB/s, from the vendors' datasheets (V100 SXM2 16 GB, A100 40 GB, A10, H100 and
#: H800 SXM 80 GB). It prices the papers' CV-CUDA pre- and post-processing (``CVCUDA``).
GPU_MEM_GBPS: dict[str, float] = {"V100-16GB": 900.0, "A100-40GB": 1555.0, "A10-24GB": 600.0, "H100-80GB": 3350.0,
                                  "H800-80GB": 3350.0}

#: The profile of a CV-CUDA operator (GROUTER §6 runs all pre- and post-processing with CV-CUDA): such
#: operators are bound by memory traffic, so one costs the bytes it reads and writes at the GPU's memory
#: bandwidth. For this profile the ``batch`` argument is those bytes, per request.
CVCUDA = "cvcuda"

#: Speed relative to V100 FP32 (see module docstring for sources).
GPU_SPEED: dict[str, float] = {"V100-16GB": 1.0, "A100-40GB": 2.56, "A10-24GB": 1.0, "H100-80GB": 5.12}


def _resnet50_ms(samples: float) -> float:
    table = RESNET50_V100_MS
    if samples <= table[0][0]:
        return table[0][1] * samples
    for (b0, t0), (b1, t1) in zip(table, table[1:], strict=False):
        if samples <= b1:
            return t0 + (t1 - t0) * (samples - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = table[-2], table[-1]
    return t1 + (t1 - t0) * (samples - b1) / (b1 - b0)


@dataclass(frozen=True)
class Profile:
    """Looks up compute times; ``scale`` multiplies every GPU time (sensitivity studies)."""

    scale: float = 1.0

    def gpu_ms(self, model: str, gpu_model: str, batch: int) -> float:
        if model == CVCUDA:
            if gpu_model not in GPU_MEM_GBPS:
                raise ConfigError(f"no memory bandwidth for GPU {gpu_model!r}; known: {', '.join(sorted(GPU_MEM_GBPS))}")
            if batch < 0:
                raise ConfigError(f"a CV-CUDA operator moves {batch} bytes; give bytes >= 0")
            return batch / (GPU_MEM_GBPS[gpu_model] * 1e6) * self.scale
        if model not in MODEL_GFLOPS:
            raise ConfigError(f"no profile for model {model!r}; known models: {', '.join(sorted(MODEL_GFLOPS))}")
        if gpu_model not in GPU_SPEED:
            raise ConfigError(f"no speed ratio for GPU {gpu_model!r}; known: {', '.join(sorted(GPU_SPEED))}")
        if batch < 1:
            raise ConfigError(f"batch size {batch} must be >= 1")
        gflops = MODEL_GFLOPS[model][0]
        v100 = _resnet50_ms(batch * gflops / RESNET50_GFLOPS)
        return v100 / GPU_SPEED[gpu_model] * self.scale

    def cpu_ms(self, name: str) -> float:
        if name not in CPU_MS:
            raise ConfigError(f"no CPU time for {name!r}; known: {', '.join(sorted(CPU_MS))}")
        return CPU_MS[name]

    def seconds(self, model: str, gpu_model: str | None, batch: int) -> float:
        """Execution time in seconds: a GPU model on ``gpu_model``, or a CPU function if None."""
        if gpu_model is None:
            return self.cpu_ms(model) / 1e3
        return self.gpu_ms(model, gpu_model, batch) / 1e3
