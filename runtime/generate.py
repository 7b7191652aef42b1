"""python -m runtime.generate: one prompt, streamed to stdout, then TTFT, TPOT and tokens/s."""
from __future__ import annotations

import argparse
import sys

from runtime.build import build_engine
from runtime.cli import run_main, setup_logging
from runtime.engine import LLMEngine
from runtime.engine_config import add_engine_args, config_from_args
from runtime.load import load_model
from runtime.sampling_params import SamplingParams


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runtime.generate", description=__doc__)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default: 0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    add_engine_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    config = config_from_args(args)
    model_config, tensors, tokenizer, _ = load_model(args.model)
    with build_engine(config, model_config, tensors, tokenizer) as engine:
        return _generate(args, engine)


def _generate(args: argparse.Namespace, engine: LLMEngine) -> int:
    tokenizer = engine.tokenizer
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        prompt = tokenizer.encode_chat(messages + [{"role": "user", "content": args.prompt}])
    else:
        prompt = args.prompt
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    engine.add_request("cli", prompt, params)
    out = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            sys.stdout.write(out.outputs[0].delta_text)
            sys.stdout.flush()
    m = out.metrics
    n = m["num_output_tokens"]
    tps = (n - 1) / (m["e2e"] - m["ttft"]) if n > 1 and m["e2e"] > m["ttft"] else float("nan")
    tpot = f"{m['tpot'] * 1000:.1f} ms" if m["tpot"] is not None else "n/a"
    print(f"\n\n[{n} tokens, finish: {out.outputs[0].finish_reason}] TTFT {m['ttft'] * 1000:.1f} ms, "
          f"TPOT {tpot}, decode {tps:.1f} tokens/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main, "runtime.generate")
