"""The two-function workflow the multi-node tests spread over nodes (handlers in rt_handlers): each
function keeps two workers, so a node of each kind holds one and locality decides where calls run."""

SPREAD_SEQ = """
name: seq
inputs: {x: {dtype: float64, shape: [-1]}}
outputs: {out: b.y}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:negate", inputs: {x: input.x}, outputs: {y: null}, scaling: {min: 2, max: 2}}
  - {name: b, kind: cpu, handler: "rt_handlers:double", inputs: {x: a.y}, outputs: {y: null, n_pos: {shape: []}},
     scaling: {min: 2, max: 2}}
"""
