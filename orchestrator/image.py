"""``python -m orchestrator.image bake [--gpu TYPE] [provider.KEY=VALUE ...]``: a GCE image with the
hosts' runtime preinstalled, so a run's VMs only unpack our wheel (README "Baked images").

The command the README documents; how an image is baked is the GCE backend's business
(`provisioning/gce/bake.py`). `provider.*` overrides are those of a run
(`conf/provider/gce.yaml`'s keys); `--gpu T4` bakes on a VM with that GPU (TensorFlow with CUDA,
`gpu` extra), default CPU (`cpu` extra). Prints the image's URL last. Exit 0 when the image is
there, 2 on a config error, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE
from provisioning.base import BadFieldError, BadRequestError
from provisioning.gce.bake import bake
from provisioning.gce.config import GceConfig

__all__ = ["bake", "main"]


def _provider_config(overrides: Sequence[str]) -> GceConfig:
    """`conf/provider/gce.yaml` with `provider.KEY=VALUE` overrides, as a run composes it."""
    from omegaconf import OmegaConf

    from orchestrator.paths import CONF_DIR
    from provisioning.registry import make_config

    base = OmegaConf.load(CONF_DIR / "provider" / "gce.yaml")
    base.pop("defaults", None)
    dotlist = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("provider."):
            raise BadRequestError(f"{item}: expected provider.KEY=VALUE")
        dotlist.append(f"{key[len('provider.'):]}={value}")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist))
    cfg = make_config("gce", OmegaConf.to_container(merged, resolve=True))  # type: ignore[arg-type]
    assert isinstance(cfg, GceConfig)
    for field, problem in cfg.check()[:1]:
        raise BadFieldError(field, problem)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(prog=prog_name("orchestrator.image"),
                                     description="Bake a GCE image with the hosts' runtime.")
    add_version_argument(parser, "orchestrator.image")
    sub = parser.add_subparsers(dest="verb", required=True)
    cmd = sub.add_parser("bake", help="create (or find) the image for this dependency set")
    cmd.add_argument("--gpu", help="GPU type of the baking VM (e.g. t4): the CUDA build")
    cmd.add_argument("--machine-type", default="n1-standard-4")
    cmd.add_argument("--zone", help="zone to bake in (default: the first of provider.zones)")
    cmd.add_argument("overrides", nargs="*", metavar="provider.KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = _provider_config(args.overrides)
        url = bake(cfg, args.gpu, args.machine_type, args.zone)
    except BadRequestError as error:
        print(f"config error: {error}", file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    except Exception as error:  # one line, not a traceback: the VM is gone already
        print(f"bake failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
