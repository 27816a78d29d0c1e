"""The handlers of the thumbs workflow (examples/thumbs/thumbs.yaml), shipped as its code package."""
