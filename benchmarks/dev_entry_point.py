"""Make the working tree's ``sparrow_server`` visible to SGLang's plug-in loader without a build.

Writes a minimal ``sparrow_server-<version>.dist-info`` (METADATA + entry_points.txt copied from
pyproject.toml) into SITE_DIR; with the repo root and SITE_DIR on PYTHONPATH, every process SGLang
spawns finds the ``sglang.srt.plugins`` entry point. Usage: python benchmarks/dev_entry_point.py SITE_DIR
"""
from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def write_dist_info(site: Path) -> Path:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = site / f"sparrow_server-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sparrow-server\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info


if __name__ == "__main__":
    site = Path(sys.argv[1])
    print("wrote", write_dist_info(site))
    sys.path.insert(0, str(site))
    found = [f"{e.name} -> {e.value}" for e in entry_points(group="sglang.srt.plugins")]
    print("sglang.srt.plugins entry points:", found)
