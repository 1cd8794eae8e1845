"""Photon: clicks joined with their queries, exactly once across pipelines (Photon, SIGMOD 2013)."""

from __future__ import annotations

from .config import GeneratorConfig, PhotonConfig
from .evaluation import RunResult, batch_join, evaluate, render
from .generator import ensure_sample, generate, load_truth
from .joiner import Adapter, Joiner
from .topology import build, join_topology, make_sources, on_finish
