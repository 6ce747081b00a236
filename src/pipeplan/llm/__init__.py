"""The LLM family's room (docs/llm.md): a decoder's dimensions and presets (``spec``), what one
layer, the embedding and the head cost on one tensor-parallel rank (``costs``), what an
iteration spends outside the layers (``step_costs``), one validated parallel configuration
(``parallelism``) and the layer layouts the engines accept (``layout``). Read by the graph
builders, the planners, the simulator and the exporters; imports none of them."""
