"""cute-serve runtime. `from runtime import LLM, SamplingParams` is the offline API."""
from runtime.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing the engine pulls in torch and the loaders
        from runtime.llm import LLM

        return LLM
    raise AttributeError(name)
