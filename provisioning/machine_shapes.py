"""Compute Engine's machine series with GPUs built in, and how many each shape carries: one
table, read by the GCE provider's request body (which shape takes which GPU, provisioning/gce/
body.py) and by the price catalogue (a shape with four GPUs pays for four). A leaf: it imports
nothing of ours, so the catalogue does not depend on the GCE backend."""

#: Machine-type family -> the catalog GPU built into it (never put in guestAccelerators).
BUILT_IN_GPUS = {"a2": "a100", "g2": "l4", "a3": "h100", "g4": "rtx-pro-6000", "a4": "b200"}
#: Machine types with a fixed number of built-in GPUs -> (catalog GPU, GPUs per VM). The series
#: listed here in full (G2, A2, A3 High/Mega/Edge/Ultra) take no other shape; families only in
#: BUILT_IN_GPUS (G4, A4) are matched by family. Sources: https://cloud.google.com/compute/docs/gpus
#: (G2: g2-standard-4/8/12/16/32 one L4, -24 two, -48 four, -96 eight; A2 Standard
#: a2-highgpu-1g/2g/4g/8g and a2-megagpu-16g A100 40GB, A2 Ultra a2-ultragpu-1g/2g/4g/8g A100
#: 80GB; A3 a3-highgpu-1g/2g/4g/8g, a3-megagpu-8g, a3-edgegpu-8g H100 80GB, a3-ultragpu-8g
#: H200), read 2026-11-28.
FIXED_GPU_SHAPES: dict[str, tuple[str, int]] = {
    **{f"g2-standard-{v}": ("l4", n) for v, n in
       ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))},
    **{f"a2-highgpu-{n}g": ("a100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("a100", 16),
    **{f"a2-ultragpu-{n}g": ("a100-80gb", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("h100", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("h100", 8), "a3-edgegpu-8g": ("h100", 8), "a3-ultragpu-8g": ("h200", 8),
}
#: Families whose every machine type is in FIXED_GPU_SHAPES: another shape does not exist.
TABLED_FAMILIES = {"g2", "a2"}


def gpus_per_vm(machine_type: str, gpu: str | None) -> int:
    """GPUs one VM of this type has: the shape's fixed count for a series with built-in GPUs
    (a2-highgpu-4g: 4), else 1 with an attached `gpu`, else 0."""
    shape = FIXED_GPU_SHAPES.get(machine_type)
    if shape is not None:
        return shape[1]
    family = machine_type.split("-", 1)[0]
    return 1 if gpu is not None or family in BUILT_IN_GPUS else 0
