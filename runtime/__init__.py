"""cute-serve runtime. `from runtime import LLM, SamplingParams, GuidedDecodingParams` is the offline API."""
from runtime import omp_wait

omp_wait.apply()  # before anything loads torch

from runtime.sampling_params import SamplingParams  # noqa: E402

__all__ = ["GuidedDecodingParams", "LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing the engine pulls in torch and the loaders
        from runtime.llm import LLM

        return LLM
    if name == "GuidedDecodingParams":  # lazy: structured output pulls in xgrammar
        from structured import GuidedDecodingParams

        return GuidedDecodingParams
    raise AttributeError(name)
