"""The live cuDNN probing engine: device, graphs, messages, serialized plans."""
