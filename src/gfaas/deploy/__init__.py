"""Running gfaas on several machines: the Ray node beside each node daemon (:mod:`.ray_node`) and a
namespaced stand-in for N machines on one host, for tests and benchmarks (:mod:`.netlab`)."""
