"""A build's stage trees (berth/build/steps.py), on real squashfs images
and layers: COPY --from's checksum of an earlier stage is remembered for
the root that stage ends with, so a rebuild does not unpack the stage to
find its COPY cached; a root made of other layers is checksummed again.
tree.unpack is wrapped to count its calls (it still unpacks)."""

import os
import subprocess
import types

from berth.build import layers, stepcache, tree
from berth.build.config import ImageConfig
from berth.build.steps import Builder, State


def _builder(cfg, work):
    options = types.SimpleNamespace(context=str(work), no_cache=False, quiet=True,
                                    build_args={}, ignore=None)
    plan = types.SimpleNamespace(escape="\\", global_args={}, stages=[
        types.SimpleNamespace(index=0, name="first", steps=[])])
    work.mkdir(exist_ok=True)
    return Builder(cfg, options=options, plan=plan, work=str(work))


def _base(tmp_path):
    source = tmp_path / "source"
    (source / "out").mkdir(parents=True)
    (source / "out/x").write_text("x\n")
    image = tmp_path / "base.sqsh"
    subprocess.run(["mksquashfs", source, image, "-noappend", "-quiet"], check=True,
                   capture_output=True)
    return str(image)


def _layer(cfg, tmp_path, key, text):
    """The cached step `key` that writes `text` to /out/x."""
    root = tmp_path / f"layer-{key}"
    (root / "out").mkdir(parents=True)
    (root / "out/x").write_text(text)
    layers.keep(cfg, key, layers.write(cfg, root, ["out/x"]))


def test_copy_from_a_stage_is_checksummed_once_per_root(tmp_path, monkeypatch):
    cfg = {"ENROOT_CACHE_PATH": str(tmp_path / "cache")}
    unpacked = []
    real = tree.unpack
    monkeypatch.setattr(tree, "unpack", lambda *a: (unpacked.append(a), real(*a)))
    end = State(key="k", image=_base(tmp_path), image_key="base", config=ImageConfig())

    def files(state, build):
        builder = _builder(cfg, tmp_path / f"work-{build}")
        builder.ends[0] = state
        found = builder.stage_files(0, ["/out/x"], where="Containerfile:3")
        return builder, found

    _, first = files(end, 1)
    assert len(unpacked) == 1
    _, again = files(end, 2)
    assert len(unpacked) == 1 and again.checksum == first.checksum
    builder, sources = files(end, 3)
    assert [e.path for s in sources.sources() for e in s.entries] == \
        [os.path.join(builder.work, "stage-0/out/x")]  # (the copy itself unpacks)
    assert len(unpacked) == 2
    _layer(cfg, tmp_path, "step", "other\n")
    _, changed = files(end._replace(layers=("step",)), 4)
    assert len(unpacked) == 3 and changed.checksum != first.checksum
    assert stepcache.sums_memo(cfg, root_at=("base", ("step",)), image=None,
                               specs=["/out/x"]).key != \
        stepcache.sums_memo(cfg, root_at=("base", ()), image=None, specs=["/out/x"]).key
