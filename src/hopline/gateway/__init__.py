"""The LLM gateway ("api" hop, SPEC G): the llm-turn app, its providers and the harness's HTTP model."""
