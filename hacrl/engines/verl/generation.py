"""The verl engine's rollout path, from the actor's weights to `Generation`s.

Three rollouts, chosen by `engine.rollout.name` and the device (`VerlEngine.generate`):

- vLLM on GPUs: verl's vLLM server replicas in the actor's processes (`start_vllm_servers`),
  woken by a weight sync before each rollout and asleep after it; requests go through
  verl's async client (`generate_on_servers`).
- hf: every actor worker samples its share of the rows from an HF copy of the actor
  (`hf_rollout`); `rows_from_shares` puts the rows back in order.
- vLLM on CPU: standalone replicas (`vllm_cpu.StandaloneVllm`).

Every response ends at its first stop token (`stop_token_ids`, `as_generation`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hacrl.algo.rollout import SamplingParams, eos_id
from hacrl.engines.base import Generation


def stop_token_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    """Every id vLLM stops on: the tokenizer's EOS and the generation config's eos_token_id
    (vLLM adds those to the stop ids; e.g. Qwen3 <|im_end|> and <|endoftext|>)."""
    from transformers import GenerationConfig

    stops = {eos_id(tokenizer)}
    try:
        extra = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        extra = None
    if extra is not None:
        stops.update([extra] if isinstance(extra, int) else extra)
    return frozenset(int(i) for i in stops)


def as_generation(tokens: list[int], stops: frozenset[int]) -> Generation:
    """A response ends at its first stop token (kept, as vLLM returns it) or is unfinished
    (the token budget, or vLLM's clamp to the model's context, cut it)."""
    for i, token in enumerate(tokens):
        if token in stops:
            return Generation(tokens[:i + 1], True)
    return Generation(list(tokens), False)


def per_prompt(rows: list[list[int]], n_prompts: int, n: int,
               stops: frozenset[int]) -> list[list[Generation]]:
    """Rows in prompt order (n consecutive rows per prompt) -> n `Generation`s per prompt."""
    return [[as_generation(tokens, stops) for tokens in rows[p * n:(p + 1) * n]]
            for p in range(n_prompts)]


def rows_from_shares(shares: list[list[Any]], count: int) -> list[Any]:
    """The hf rollout's per-rank shares back in row order: row i was sampled on rank
    i mod world, as that rank's (i // world)-th row."""
    world = len(shares)
    return [shares[i % world][i // world] for i in range(count)]


def refuse_long_prompts(agent: str, prompt_ids: list[list[int]], budget: int) -> None:
    """vLLM rollouts: a prompt longer than the rollout's prompt budget (verl's prompt_length,
    from eval.vllm.max_prompt_tokens; vLLM's max_model_len is it + the response budget) gets a
    response budget cut to what is left of max_model_len by verl's server, silently, or, with
    no room left, an error deep in a replica; here it is one line before anything is sent."""
    longest = max((len(ids) for ids in prompt_ids), default=0)
    if longest > budget:
        from hacrl.core.errors import ConfigError

        over = sum(len(ids) > budget for ids in prompt_ids)
        raise ConfigError(
            f"eval.vllm.max_prompt_tokens={budget}: {agent}'s vLLM rollout got {over} of "
            f"{len(prompt_ids)} prompts longer than it (the longest {longest} tokens in "
            f"{agent}'s chat template), whose responses vLLM would cut short; set "
            f"eval.vllm.max_prompt_tokens={longest} or more and rerun the same command (the "
            f"job resumes from its newest checkpoint)")


def rollout_seed(job_seed: int, agent_index: int, version: int) -> int:
    """Sampling seed of an agent's rollout: job seed, agent, weight version (a resumed job
    draws the same rollouts)."""
    return (job_seed * 1_000_003 + agent_index * 7919 + version) % 2**31


def start_vllm_servers(config: Any, workers: Any, pool: Any, agent_index: int,
                       world_size: int) -> tuple[Any, Any]:
    """verl's vLLM server replicas of one agent (hybrid: in its actor workers' processes),
    their replica ranks offset past the agents before it, and the weight-sync manager that
    wakes them; returned asleep. (servers, weights)."""
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.llm_server import LLMServerManager
    from verl.workers.rollout.replica import get_rollout_replica_class

    from hacrl.engines.verl.workers import offset_replica_class

    rollout = config.actor_rollout_ref.rollout
    replica_size = int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size) \
        * int(rollout.pipeline_model_parallel_size)
    offset = agent_index * (world_size // replica_size)
    workers.offset_replica_rank(offset)

    class Servers(LLMServerManager):  # type: ignore[misc, valid-type]
        rollout_replica_class = offset_replica_class(
            get_rollout_replica_class(str(rollout.name)), offset)

    servers = Servers.create(config=config, worker_group=workers,
                             rollout_resource_pool=pool, start_rank=offset)
    ce = omega_conf_to_dataclass(rollout.checkpoint_engine)
    ce.backend = "naive"  # colocated actor and rollout: in-process weight sync
    weights = CheckpointEngineManager(config=ce, actor_wg=workers,
                                      replicas=servers.get_replicas())
    weights.sleep_replicas()
    return servers, weights


async def generate_on_servers(servers: Any, prompt_ids: list[list[int]], n: int,
                              sampling: SamplingParams) -> list[list[int]]:
    """n samples per prompt from the vLLM servers, in prompt order."""
    client = servers.get_client()
    params = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
              "top_p": 1.0 if sampling.greedy else sampling.top_p, "top_k": -1,
              "max_tokens": sampling.max_new_tokens, "logprobs": False}

    async def one(ids: list[int]) -> list[int]:
        out = await client.generate(uuid.uuid4().hex, prompt_ids=ids, sampling_params=params)
        return list(out.token_ids)

    return list(await asyncio.gather(*(one(ids) for ids in prompt_ids for _ in range(n))))


__all__ = ["as_generation", "generate_on_servers", "per_prompt", "refuse_long_prompts",
           "rollout_seed", "rows_from_shares", "start_vllm_servers", "stop_token_ids"]
