"""The training script of the multi-host test, run on the head host: docs/scaling.md's ``train_on_ray.py``.

    python tests/_host_train.py SETTINGS.json

``SETTINGS.json`` names the run folder, the tiny model, the Ray head's
address, this host's address (the coordinator binds it, with ``api_key``),
the number of nodes to wait for, and the tasks. It joins the cluster,
waits until every node is up, and trains with ``RayExecutor`` spreading the
rollouts over the worker hosts; the scripted policy of the adapter tests
answers the model calls, the tiny model's LoRA is trained on them. The
trainer's result goes to ``<run_dir>/result.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def wait_for_nodes(count: int, timeout: float = 120) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while (alive := sum(1 for n in ray.nodes() if n["Alive"])) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Ray cluster has {alive} of {count} nodes after {timeout} s")
        time.sleep(0.5)


def main(settings: dict) -> None:
    import ray
    import torch

    from _adapter_support import policy
    from _host_agents import host_agent
    from mtrl_runtime import MtrlConfig, MultiTurnRLTrainer
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.executors import RayExecutor
    from mtrl_runtime.testing import tiny_tokenizer

    torch.set_num_threads(1)
    config = MtrlConfig.from_dict(settings["config"])
    ray.init(address=settings["ray_address"], log_to_driver=False)
    try:
        print(f"joined the cluster at {settings['ray_address']}", flush=True)
        wait_for_nodes(settings["nodes"], settings.get("nodes_timeout_s", 120))
        print(f"{settings['nodes']} nodes up", flush=True)
        executor = RayExecutor(host_agent, num_cpus=1, remote_options={"scheduling_strategy": "SPREAD"})
        trainer = MultiTurnRLTrainer(agent_env=executor, training_dataset=settings["tasks"], config=config,
                                     engine=ScriptedEngine(tiny_tokenizer(), policy), tracking=False)
        result = trainer.train(progress=True)
    finally:
        ray.shutdown()
    out = {"steps": [report.metrics for report in result.reports], "adapter": str(result.output_adapter_path)}
    (Path(config.core.run_dir) / "result.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
