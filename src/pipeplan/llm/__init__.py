"""The LLM family's room (docs/llm.md): one validated parallel configuration
(``parallelism``) and the layer layouts the engines accept (``layout``). Read by the planners,
the simulator and the exporters; imports none of them."""
