"""verl worker classes for hacrl, built on verl's public extension points (no patched copy).

- `HacrlTrainingWorker` (the actor's `TrainingWorker`): puts the update index m the driver
  sends into the mini-batch's data, where the loss callable reads it. A call must be exactly one
  mini-batch (one optimizer update, like the local engine): verl would split a larger call into
  per-rank slices that are not the loop's mini-batches, with other denominators, so it is refused.
- `HacrlActorRolloutRefWorker`: verl's hybrid actor/rollout worker with that training worker,
  plus `offset_replica_rank`, which moves this agent's rollout replicas to global ranks
  offset + r so that two agents' vLLM servers (Ray actor names, IPC sockets) never collide.
- `offset_replica_class`: the driver-side replica class that names itself by its global rank
  but takes its workers from its own agent's worker group.

verl is imported when `worker_classes()` is first called (on the driver, or in a Ray worker
that unpickles the classes).
"""

from __future__ import annotations

import functools
from typing import Any

from hacrl.engines.verl.worker_loss import UPDATE_INDEX


class UpdateNumbering:
    """m of each mini-batch of one update call: the call's first m (sent by the driver) plus
    the mini-batches seen since. Shared by the worker below and the CPU tests."""

    def __init__(self) -> None:
        self.base, self.seen = 0, 0

    def begin(self, data: Any) -> None:
        from verl.utils import tensordict_utils as tu

        self.base, self.seen = int(tu.pop(data, key=UPDATE_INDEX, default=0)), 0

    def number(self, data: Any) -> int:
        from verl.utils import tensordict_utils as tu

        index = self.base + self.seen
        tu.assign_non_tensor(data, **{UPDATE_INDEX: index})
        self.seen += 1
        return index


@functools.cache
def worker_classes() -> tuple[type, type]:
    """(HacrlTrainingWorker, HacrlActorRolloutRefWorker)."""
    training_worker = _training_worker_class()
    return training_worker, _actor_rollout_ref_worker_class(training_worker)


def _training_worker_class() -> type:
    """HacrlTrainingWorker: verl's TrainingWorker that numbers the mini-batches of a call."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker

    class HacrlTrainingWorker(TrainingWorker):  # type: ignore[misc, valid-type]
        numbering = UpdateNumbering()

        def train_mini_batch(self, data: Any) -> Any:
            size = tu.get(data, key="mini_batch_size", default=None)
            ranks = self.engine.get_data_parallel_size()
            if size is None or int(size) != data.shape[0] * ranks:
                raise ValueError(f"hacrl sends one mini-batch per update_actor call; got "
                                 f"mini_batch_size={size} for {data.shape[0]} rows x {ranks} ranks")
            self.numbering = UpdateNumbering()
            self.numbering.begin(data)
            return TrainingWorker.train_mini_batch(self, data)

        def train_batch(self, data: Any) -> Any:
            self.numbering.number(data)
            return TrainingWorker.train_batch(self, data)

    return HacrlTrainingWorker


def _actor_rollout_ref_worker_class(training_worker: Any) -> type:
    """HacrlActorRolloutRefWorker: verl's hybrid worker with `training_worker` as its actor and
    the calls the driver makes on it (hf generation, HF weights, replica-rank offset)."""
    from verl.single_controller.base.decorator import Dispatch as dispatch_modes
    from verl.single_controller.base.decorator import register
    from verl.workers.engine_workers import ActorRolloutRefWorker

    one_to_all: Any = getattr(dispatch_modes, "ONE_TO_ALL")  # noqa: B009 (registered at runtime)

    class HacrlActorRolloutRefWorker(ActorRolloutRefWorker):  # type: ignore[misc, valid-type]
        actor_worker_cls = training_worker

        @register(dispatch_mode=one_to_all)
        def init_model(self) -> None:
            from verl.utils.device import get_device_name

            if get_device_name() == "cpu":  # a plain gloo group (see cpu_platform)
                from hacrl.engines.verl.cpu_platform import init_process_group

                init_process_group()
            return ActorRolloutRefWorker.init_model(self)

        @register(dispatch_mode=one_to_all)
        def hf_generate(self, prompt_ids: list[list[int]], n: int, sampling: dict[str, Any],
                        seed: int, pad_id: int, eos: int) -> list[tuple[list[int], bool]]:
            """`rollout.name=hf`: this rank's share (rows rank, rank + world, ...) of n
            responses per prompt, sampled from the weights of the last `update_weights`.
            The seed (the driver's, per agent and weight version) makes rollouts reproducible
            and resumable; each rank offsets it by its rank."""
            return _generate_share(self, prompt_ids, n, sampling, seed, pad_id, eos)

        @register(dispatch_mode=one_to_all)
        def save_hf_weights(self, path: str) -> int:
            """The actor's current full weights as `<path>/model.safetensors` (HF names), for
            the standalone vLLM replicas on CPU (`hacrl.engines.verl.vllm_cpu`), which reload
            them. Every rank takes part in the gathers, rank 0 writes (a temp name first:
            vLLM reads every *.safetensors). Returns the number of tensors written."""
            return _save_full_weights(self, path)

        @register(dispatch_mode=one_to_all)
        def offset_replica_rank(self, offset: int) -> int:
            """Call after init_model, before the replicas are launched; returns the new rank."""
            rollout = getattr(self, "rollout", None)
            if rollout is None or offset == 0:
                return -1 if rollout is None else int(rollout.replica_rank)
            old = int(rollout.replica_rank)
            rollout.replica_rank = old + offset
            handle = getattr(rollout, "zmq_handle", None)
            if isinstance(handle, str):
                rollout.zmq_handle = handle.replace(f"-replica-{old}-", f"-replica-{old + offset}-")
            return int(rollout.replica_rank)

    return HacrlActorRolloutRefWorker


def _generate_share(worker: Any, prompt_ids: list[list[int]], n: int, sampling: dict[str, Any],
                    seed: int, pad_id: int, eos: int) -> list[tuple[list[int], bool]]:
    """The body of `hf_generate` on `worker` (an HacrlActorRolloutRefWorker)."""
    import torch

    from hacrl.algo.rollout import SamplingParams

    rows = [ids for ids in prompt_ids for _ in range(n)][worker.rank::worker.world_size]
    if not rows:
        return []
    torch.manual_seed(seed * 1009 + worker.rank)
    rollout: Any = worker.rollout  # an HFRollout (engine.rollout.name=hf)
    gens = rollout.generate(rows, SamplingParams(**sampling), pad_id=pad_id, eos=eos)
    return [(g.token_ids, g.finished) for g in gens]


def _save_full_weights(worker: Any, path: str) -> int:
    """The body of `save_hf_weights` on `worker` (an HacrlActorRolloutRefWorker)."""
    import os

    import torch
    from safetensors.torch import save_file

    assert worker.actor is not None, "save_hf_weights needs the actor role"
    params, _ = worker.actor.engine.get_per_tensor_param()
    keep = worker.rank == 0
    state = {}
    for name, tensor in params:
        if keep:
            state[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if keep:
        os.makedirs(path, exist_ok=True)
        tmp = os.path.join(path, "model.safetensors.partial")
        save_file(state, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(path, "model.safetensors"))
    torch.distributed.barrier()
    return len(state)


def offset_replica_class(base: type, offset: int) -> type:
    """A rollout replica class whose replica r of this agent has global rank offset + r."""

    class OffsetReplica(base):  # type: ignore[misc, valid-type]
        rank_offset = offset

        async def init_hybrid(self, worker_group: Any) -> None:
            from verl.workers.rollout.replica import RolloutMode

            self.rollout_mode = RolloutMode.HYBRID
            local = self.replica_rank - self.rank_offset
            self.workers = worker_group.workers[self.world_size * local:
                                                self.world_size * (local + 1)]
            await self.launch_servers()

    OffsetReplica.__name__ = f"{base.__name__}Offset{offset}"
    return OffsetReplica


__all__ = ["UpdateNumbering", "offset_replica_class", "worker_classes"]
