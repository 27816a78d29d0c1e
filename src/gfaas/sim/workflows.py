"""The papers' reference workflows as DAGs with data sizes (seed 000 Table 1, seed 001 Fig. 12).

The papers name the functions and patterns but not the tensor sizes, so sizes are derived from a
stated input: a batch of ``FRAMES`` 1080p RGB frames (1920 x 1080 x 3 bytes = 6.2 MB each),
detector inputs of 640 x 640 x 3 float32 (4.9 MB per image), classifier crops of 224 x 224 x 3
float32 (0.6 MB each) and BERT inputs of 128 tokens. Each size below shows its arithmetic.

A function's inputs are the outputs of its predecessors plus, for a function with ``input_bytes``,
data that starts in host memory (decoded frames: the host-to-gFn case). ``output_bytes`` goes back
to host memory at the end (the gFn-to-host case). A conditional edge is taken with ``prob``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError

MB = 10**6
FRAMES = 8
FRAME = 1920 * 1080 * 3          # 6.22 MB, uint8 RGB
DET_IN = 640 * 640 * 3 * 4       # 4.92 MB, float32
CROP = 224 * 224 * 3 * 4         # 0.60 MB, float32
TOKENS = 128 * 768 * 4           # 0.39 MB, BERT hidden states of one sequence


@dataclass(frozen=True)
class Function:
    """A workflow stage. ``model`` names a GPU profile (kind gpu) or a CPU time (kind cpu)."""

    name: str
    kind: Literal["gpu", "cpu"]
    model: str
    batch: int = FRAMES
    input_bytes: int = 0    # bytes it reads from host memory when it starts
    output_bytes: int = 0   # bytes it writes back to host memory when it ends


@dataclass(frozen=True)
class DataEdge:
    src: str
    dst: str
    nbytes: int
    prob: float = 1.0


@dataclass(frozen=True)
class Workflow:
    name: str
    pattern: Literal["sequence", "condition", "fan-in", "fan-out", "layers"]
    functions: tuple[Function, ...]
    edges: tuple[DataEdge, ...]
    source: str = ""
    _by_name: dict[str, Function] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ConfigError(f"workflow {self.name!r} repeats a function name: {names}")
        object.__setattr__(self, "_by_name", {f.name: f for f in self.functions})
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in self._by_name:
                    raise ConfigError(f"workflow {self.name!r}: edge {e.src}->{e.dst} names unknown function {end!r}")
            if not 0 < e.prob <= 1:
                raise ConfigError(f"workflow {self.name!r}: edge {e.src}->{e.dst} probability {e.prob} not in (0, 1]")
        order = self.topological_order()  # raises on cycles
        del order

    def function(self, name: str) -> Function:
        return self._by_name[name]

    def preds(self, name: str) -> list[DataEdge]:
        return [e for e in self.edges if e.dst == name]

    def succs(self, name: str) -> list[DataEdge]:
        return [e for e in self.edges if e.src == name]

    def topological_order(self) -> list[str]:
        indeg = {f.name: 0 for f in self.functions}
        for e in self.edges:
            indeg[e.dst] += 1
        ready = [f.name for f in self.functions if indeg[f.name] == 0]
        out: list[str] = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for e in self.succs(n):
                indeg[e.dst] -= 1
                if indeg[e.dst] == 0:
                    ready.append(e.dst)
        if len(out) != len(self.functions):
            raise ConfigError(f"workflow {self.name!r} has a cycle; a workflow must be a DAG")
        return out

    @property
    def gpu_functions(self) -> list[str]:
        return [f.name for f in self.functions if f.kind == "gpu"]



def _f(name: str, kind: Literal["gpu", "cpu"], model: str, **kw: int) -> Function:
    return Function(name, kind, model, **kw)


def traffic() -> Workflow:
    """Boggart-style traffic monitoring: detect, then recognise people and cars (condition)."""
    return Workflow("traffic", "condition", (
        _f("decode", "cpu", "decode"),
        _f("preproc", "gpu", "preproc", input_bytes=FRAMES * FRAME),                 # 49.8 MB frames in
        _f("detect", "gpu", "yolo-det"),
        _f("person", "gpu", "resnet50", batch=24),
        _f("car", "gpu", "resnet50", batch=24, output_bytes=1 * MB),
    ), (
        DataEdge("preproc", "detect", FRAMES * DET_IN),                              # 39.3 MB
        DataEdge("detect", "person", 24 * CROP, prob=0.6),                           # 14.5 MB of crops
        DataEdge("detect", "car", 24 * CROP, prob=0.8),
    ), "seed 000 Table 1 / 001 Fig. 12, Boggart (Agarwal and Netravali 2023)")


def driving() -> Workflow:
    """AdaInf-style road segmentation: denoise, segment, colour (sequence)."""
    return Workflow("driving", "sequence", (
        _f("decode", "cpu", "decode"),
        _f("denoise", "gpu", "denoise", input_bytes=FRAMES * FRAME),                 # 49.8 MB
        _f("segment", "gpu", "yolo-seg"),
        _f("colour", "gpu", "colour", output_bytes=FRAMES * FRAME),                  # 49.8 MB back to host
    ), (
        DataEdge("denoise", "segment", FRAMES * FRAME),                              # 49.8 MB
        DataEdge("segment", "colour", FRAMES * 1920 * 1080 * 2),                     # 33.2 MB class map (int16)
    ), "seed 000 Table 1 / 001 Fig. 12, AdaInf (Shubha and Shen 2023)")


def video(chunks: int = 4) -> Workflow:
    """Aquatope-style video processing: face detection on chunks in parallel, then recognition (fan-in)."""
    fns = [_f("decode", "cpu", "decode")]
    edges = []
    for i in range(chunks):
        fns.append(_f(f"face{i}", "gpu", "yolo-face", input_bytes=FRAMES * FRAME))   # 49.8 MB per chunk
        edges.append(DataEdge(f"face{i}", "recognise", FRAMES * FRAME))             # frames + boxes forwarded
    fns.append(_f("recognise", "gpu", "resnet50", batch=16, output_bytes=1 * MB))
    return Workflow("video", "fan-in", tuple(fns), tuple(edges),
                    "seed 000 Table 1 / 001 Fig. 12, Aquatope (Zhou et al. 2022)")


def image() -> Workflow:
    """Cocktail-style ensemble: denoise, several classifiers, aggregate (fan-out)."""
    return Workflow("image", "fan-out", (
        _f("decode", "cpu", "decode"),
        _f("denoise", "gpu", "denoise", input_bytes=FRAMES * FRAME),                 # 49.8 MB
        _f("resnet50", "gpu", "resnet50"),
        _f("resnet101", "gpu", "resnet101"),
        _f("alexnet", "gpu", "alexnet"),
        _f("aggregate", "cpu", "aggregate"),
    ), (
        DataEdge("denoise", "resnet50", FRAMES * DET_IN),                            # 39.3 MB each
        DataEdge("denoise", "resnet101", FRAMES * DET_IN),
        DataEdge("denoise", "alexnet", FRAMES * DET_IN),
        DataEdge("resnet50", "aggregate", FRAMES * 4000),                            # logits, 32 KB
        DataEdge("resnet101", "aggregate", FRAMES * 4000),
        DataEdge("alexnet", "aggregate", FRAMES * 4000),
    ), "seed 000 Table 1 / 001 Fig. 12, Cocktail (Gunasekaran et al. 2022)")


def social() -> Workflow:
    """InferLine-style social media: OCR, then BERT on posts with text (condition)."""
    return Workflow("social", "condition", (
        _f("decode", "cpu", "decode"),
        _f("preproc", "gpu", "preproc", input_bytes=FRAMES * FRAME),
        _f("ocr", "gpu", "ocr"),
        _f("bert", "gpu", "bert", output_bytes=FRAMES * 4000),
    ), (
        DataEdge("preproc", "ocr", FRAMES * DET_IN),
        DataEdge("ocr", "bert", FRAMES * TOKENS, prob=0.7),
    ), "seed 000 Table 1, InferLine (Crankshaw et al. 2020)")


def yelp() -> Workflow:
    """Astraea-style comment handling: BERT then BERT (sequence); small text tensors."""
    return Workflow("yelp", "sequence", (
        _f("classify", "gpu", "bert", input_bytes=FRAMES * 128 * 8),
        _f("reply", "gpu", "bert", output_bytes=FRAMES * 4000),
    ), (DataEdge("classify", "reply", FRAMES * TOKENS),),
        "seed 000 Table 1, Astraea (Zhang et al. 2022)")


def moa(layers: int = 3, agents: int = 3, kv_bytes: int = 4096 * 2 * 32 * 4096 * 2) -> Workflow:
    """Mixture-of-Agents: every agent of a layer reads the KV caches of all agents of the previous one.

    The default KV cache is a 4K-token prompt of a 7B-class model: 4096 tokens x 2 (K, V) x 32 layers
    x 4096 hidden x 2 bytes = 2.1 GB (seed 001 §6.4 uses 4K inputs).
    """
    fns = []
    edges = []
    for layer in range(layers):
        for a in range(agents):
            fns.append(_f(f"l{layer}a{a}", "gpu", "bert", batch=1,
                          input_bytes=4096 * 8 if layer == 0 else 0))
            if layer:
                edges += [DataEdge(f"l{layer - 1}a{p}", f"l{layer}a{a}", kv_bytes) for p in range(agents)]
    return Workflow("moa", "layers", tuple(fns), tuple(edges), "seed 001 §6.4, Mixture-of-Agents (Wang et al. 2024)")


WORKFLOWS = {"traffic": traffic, "driving": driving, "video": video, "image": image, "social": social,
             "yelp": yelp, "moa": moa}


def workflow(name: str) -> Workflow:
    if name not in WORKFLOWS:
        raise ConfigError(f"unknown workflow {name!r}; choose one of {', '.join(WORKFLOWS)}")
    return WORKFLOWS[name]()
