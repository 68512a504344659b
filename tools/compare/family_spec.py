"""How a --family entry names a flashjit implementation: the dispatcher's choice, a family, or
a family with its tile shape forced (no imports: every runner module reads it)."""


def tile_shape(text):
    """(tile_m, tile_n, stages) of 'MxNxS' (three decimal numbers), or None for anything else."""
    dims = text.split("x")
    return tuple(map(int, dims)) if len(dims) == 3 and all(d.isdigit() for d in dims) else None


def family_and_tiles(name):
    """(family or None for the dispatcher's, tiles (tile_m, tile_n, stages) or None) of a
    --family entry: 'auto', '<family>', or '<family>@MxNxS' (that family with its tile shape
    forced, e.g. decode_tma@16x64x3)."""
    family, _, shape = name.partition("@")
    return (None if family == "auto" else family), tile_shape(shape) if shape else None
