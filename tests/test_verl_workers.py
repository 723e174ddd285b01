"""The verl worker plumbing on Ray CPU worker groups (what verl allows without GPUs):

- a HACPO training batch (rows + HACPO fields + the update index m) goes through verl's own
  data-parallel dispatch (`make_nd_compute_dataproto_dispatch_fn`) to two worker processes;
  each numbers its mini-batches with the training worker's rule and computes hacrl's loss
  callable on its share: m arrives, and the ranks' losses add up to the whole mini-batch's;
- `HacrlActorRolloutRefWorker.offset_replica_rank` (ONE_TO_ALL) moves two agents' rollout
  replica ranks and IPC sockets apart.

The FSDP engine and vLLM (GPU only) are replaced by what the test worker computes itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="engine=verl tests need the [verl] extra: "
                    "pip install -e '.[verl]'")
ray = pytest.importorskip("ray", reason="Ray comes with the [verl] extra")

from hacrl.algo import Denominators, LossBatch, LossConfig, policy_loss  # noqa: E402
from hacrl.algo.rollout import TokenView  # noqa: E402
from hacrl.config.settings import optimizer_settings  # noqa: E402
from hacrl.engines.verl import batch as vb  # noqa: E402
from hacrl.engines.verl.worker_loss import DENOMINATORS, UPDATE_INDEX  # noqa: E402

pytestmark = pytest.mark.verl
CONFIG = LossConfig(alpha=0.6, kl_coef=0.0)


@pytest.fixture(scope="module")
def ray_cpu(tmp_path_factory: pytest.TempPathFactory):
    import os

    from hacrl.engines.verl.ray_cluster import use_auth_mode

    # a local ray.init() would otherwise write ~/.ray/auth_token into the user's home
    previous = os.environ.get("RAY_AUTH_MODE")
    use_auth_mode("disabled")
    # logical CPUs: every worker group reserves one bundle per worker (2 cores are plenty)
    ray.init(num_cpus=8, num_gpus=0, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")),
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parents[1])}})
    yield
    ray.shutdown()
    if previous is None:
        del os.environ["RAY_AUTH_MODE"]
    else:
        os.environ["RAY_AUTH_MODE"] = previous


def _rows(n: int) -> tuple[list[TokenView], LossBatch]:
    gen = torch.Generator().manual_seed(11)
    views = [TokenView((1, 2, 3)[: 1 + b % 3], tuple(range(4, 5 + b % 5))) for b in range(n)]
    width = max(len(v.response_ids) for v in views)
    mask = torch.zeros(n, width)
    for b, v in enumerate(views):
        mask[b, :len(v.response_ids)] = 1
    cross = torch.arange(n) % 2 == 1
    return views, LossBatch(
        response_mask=mask, old_logp=(torch.randn(n, width, generator=gen) * 0.1 - 1) * mask,
        source_mean_logp=torch.randn(n, generator=gen) * 0.1 - 1,
        advantages=torch.randn(n, generator=gen), omega=torch.ones(n) * 1.3,
        cross=cross, own=~cross)


def _rank_worker_class() -> type:
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import (
        make_nd_compute_dataproto_dispatch_fn,
        register,
    )

    class LossRank(Worker):
        """One data-parallel rank: verl's mini-batch iterator, the training worker's update
        numbering, hacrl's loss callable on log-probs carried in the batch."""

        def __init__(self) -> None:
            super().__init__()
            self._register_dispatch_collect_info("actor", dp_rank=self.rank, is_collect=True)

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def update_actor(self, data):  # noqa: ANN001, ANN202
            from verl.utils import tensordict_utils as tu

            from hacrl.engines.verl.worker_loss import loss_callable
            from hacrl.engines.verl.workers import UpdateNumbering

            numbering = UpdateNumbering()
            numbering.begin(data)
            per_gpu = tu.pop(data, key="mini_batch_size") // 2
            losses, indices = [], []
            for mini in tu.make_iterator(data, mini_batch_size=per_gpu, epochs=1, seed=0):
                indices.append(numbering.number(mini))
                logp = mini["test_logp"]
                loss, _ = loss_callable(LossConfig(alpha=0.6, kl_coef=0.0))(
                    model_output={"log_probs": logp}, data=mini, dp_group=None)
                losses.append(float(loss))
            return tu.get_tensordict({"loss": torch.tensor(losses),
                                      "m": torch.tensor(indices, dtype=torch.long)})

    return LossRank


def _group(cls: type, **init: Any) -> Any:
    """Two ranks of `cls` (the group's methods are added at run time: typed Any)."""
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(num_cpus=0.5)(cls), **init), device_name="cpu")


def test_update_index_and_rows_reach_every_rank(ray_cpu: None) -> None:
    views, batch = _rows(8)
    width = batch.response_mask.shape[1]
    logp = (batch.old_logp - 0.2) * batch.response_mask
    d = Denominators.of(batch)
    fields = {**vb.loss_fields(batch, width), "test_logp": logp}
    meta = {UPDATE_INDEX: 5, DENOMINATORS: dataclasses.astuple(d), "dp_size": 2}
    group = _group(_rank_worker_class())
    # one mini-batch per call (what the engine sends): m arrives, ranks add up to the whole
    out = group.update_actor(vb.to_tensordict(views, 0, fields, {**meta, "mini_batch_size": 8}))
    assert out["m"].tolist() == [5, 5]
    whole = policy_loss(logp, batch, CONFIG, update_index=5).loss
    assert abs(float(out["loss"].sum()) / 2 - float(whole)) < 1e-6
    # a call verl splits into two mini-batches numbers them m, m + 1 on every rank
    out = group.update_actor(vb.to_tensordict(views, 0, fields, {**meta, "mini_batch_size": 4}))
    assert out["m"].tolist() == [5, 6, 5, 6]


def test_two_agents_rollout_replicas_get_disjoint_ranks_and_sockets(ray_cpu: None) -> None:
    from omegaconf import OmegaConf
    from verl.single_controller.base.decorator import Dispatch, register

    one_to_all = Dispatch.from_name("ONE_TO_ALL")  # registered at run time: no attribute to type

    from hacrl.config import compose
    from hacrl.engines.verl.translate import verl_config
    from hacrl.engines.verl.workers import worker_classes

    class WithRolloutStandIn(worker_classes()[1]):  # type: ignore[misc, valid-type]
        @register(dispatch_mode=one_to_all)
        def attach_rollout(self, job: str) -> None:
            """What verl's vLLM ServerAdapter sets up (GPU only): rank and IPC socket."""
            from types import SimpleNamespace

            rank = self.rank  # one GPU per replica (tensor parallel 1)
            self.rollout = SimpleNamespace(
                replica_rank=rank, zmq_handle=f"ipc:///tmp/rl-colocate-zmq-{job}-replica-{rank}-rank-0.sock")

        @register(dispatch_mode=one_to_all)
        def socket(self) -> str:
            return self.rollout.zmq_handle

    cfg = compose(["scale=paper", "engine=verl"])
    v = verl_config(cfg, model_path="m", loss=CONFIG, optimizer=optimizer_settings(cfg), group_size=8, minibatch_prompts=64,
                    n_agents=2)
    arr = OmegaConf.to_container(v.actor_rollout_ref, resolve=True)
    sockets, ranks = [], []
    for agent in range(2):
        group = _group(WithRolloutStandIn, config=OmegaConf.create(arr), role="actor_rollout")
        group.attach_rollout("J")
        ranks += group.offset_replica_rank(agent * 2)
        sockets += group.socket()
    assert ranks == [0, 1, 2, 3]
    assert len(set(sockets)) == 4 and sockets[2].endswith("-replica-2-rank-0.sock")
