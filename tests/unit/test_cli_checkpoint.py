"""``energon-ray checkpoint info|redist`` refusing what is no energon_ray state, naming the file (no Ray).

What the commands print for real saved states, and a restore from ``redist``'s output, are tested
with a real loader in ``tests/integration/test_elastic_restore.py``.
"""

from __future__ import annotations

import json
import zipfile

import torch
from click.testing import CliRunner
from megatron.energon.savable_loader import SavableDataLoaderState

from energon_ray.cli.main import main
from energon_ray.loader.state import LoaderState


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_an_energon_checkpoint_is_named_as_energon_s(tmp_path):
    """Energon's ``save_state_global`` list, ``torch.save``d: refused as Energon's, never unpickled."""
    path = tmp_path / "loader.pt"
    torch.save([SavableDataLoaderState(worker_states=[], next_worker_id=0, micro_batch_size=4)], path)
    result = run_cli("checkpoint", "info", path)
    assert result.exit_code == 1 and result.output == (
        f"Error: {path}: a Megatron-Energon loader checkpoint (it pickles megatron.energon objects); energon_ray "
        "cannot read Energon's states: use `energon checkpoint info`, or save the loader with energon_ray\n"
    )


def test_pickled_state_objects_are_not_unpickled(tmp_path):
    """A ``.pt`` of ``LoaderState`` objects needs unpickling: refused, saying what to save instead."""
    path = tmp_path / "states.pt"
    torch.save([LoaderState(version=2, rank=0, world_size=1, num_workers=1, fingerprint="f", passes=1)], path)
    result = run_cli("checkpoint", "info", path)
    assert result.exit_code == 1 and result.output == (
        f"Error: {path}: cannot be read with torch.load(weights_only=True), the only way this command loads a .pt "
        "file (it never unpickles objects): it pickles energon_ray LoaderState objects: save "
        "[s.to_dict() for s in states] (or to_json()) instead\n"
    )


def test_foreign_files_and_folders_are_refused_by_name(tmp_path):
    """Not JSON, a JSON of something else or of another state version, a folder without rank files,
    a global file beside other files: each refused naming the file."""
    text, other, old = tmp_path / "notes.txt", tmp_path / "other.json", tmp_path / "old.json"
    text.write_text("step 100\n")
    other.write_text(json.dumps({"model": "gpt"}))
    old.write_text(json.dumps({"version": 1, "rank": 0}))
    empty = tmp_path / "empty"
    empty.mkdir()
    archive = tmp_path / "notes.pt"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("notes.txt", "step 100")
    outputs = [run_cli("checkpoint", "info", p).output for p in (text, other, old, empty)]
    assert run_cli("checkpoint", "info", archive).output.startswith(
        f"Error: {archive}: not an energon_ray loader state: a zip file that torch.load cannot read (RuntimeError: "
    )
    assert outputs == [
        f"Error: {text}: not an energon_ray loader state: neither JSON (Expecting value: line 1 column 1 (char 0)) "
        "nor a torch.save file\n",
        f"Error: {other}: not an energon_ray loader state: dict without a 'version'\n",
        f"Error: {old}: loader state version 1 is not supported (this energon_ray reads version 2); save the state "
        "again with the energon_ray version that restores it\n",
        f"Error: {empty}: no loader state files (energon_ray_loader_rankN.json, as save_loader_state writes) in this "
        "folder\n",
    ]
    listed = tmp_path / "global.json"
    listed.write_text(json.dumps([None, None]))
    assert run_cli("checkpoint", "info", listed).output == (
        "checkpoint: global file (2 entries), every rank saved before its first batch (all start afresh)\n"
    )
    mixed = run_cli("checkpoint", "redist", listed, old, tmp_path / "out", "--new-world-size", "2")
    assert mixed.exit_code == 1 and mixed.output == (
        f"Error: {listed}: holds a list of states (a global file); pass it alone, not with other files\n"
    )
    none = run_cli("checkpoint", "redist", listed, tmp_path / "out", "--new-world-size", "2")
    assert none.exit_code == 1 and none.output == (
        f"Error: {listed}[0], {listed}[1]: saved before its first batch; restoring on another world size needs every "
        "rank's state (restore with the world size it was saved with, or save again after a batch)\n"
    )
    assert not (tmp_path / "out").exists()


def test_items_this_epoch_are_shown_for_an_epochized_loader_only(tmp_path):
    """A state's ``epoch_items`` counts the items of an epochized loader's iter(): shown with what it is
    when counted; a loader that is not epochized saves 0, which is not shown as "items this epoch 0"."""
    lines = []
    for items in (0, 3):
        path = tmp_path / f"state{items}.json"
        state = LoaderState(version=2, rank=0, world_size=1, num_workers=1, fingerprint="f", passes=1, pass_index=0, epoch_items=items)
        path.write_text(state.to_json())
        result = run_cli("checkpoint", "info", path)
        assert result.exit_code == 0, result.output
        lines.append(result.output.splitlines()[-1])
    assert lines == [
        "rank 0 (state0.json): pass 0 (passes started 1)",
        "rank 0 (state3.json): pass 0 (passes started 1), items this epoch 3 (epochized loader)",
    ]


def test_redist_never_overwrites_a_json_file(tmp_path):
    """redist refuses an OUT .json file that exists (one of its PATHS, say), as it refuses a folder
    holding rank files; it wrote over it."""
    saved = tmp_path / "state.json"
    saved.write_text(LoaderState(version=2, rank=0, world_size=1, num_workers=1, fingerprint="f", passes=1, pass_index=0).to_json())
    before = saved.read_text()
    for out in (saved, tmp_path / "other.json"):
        if out != saved:
            out.write_text("[]")
        result = run_cli("checkpoint", "redist", saved, out, "--new-world-size", "2")
        assert result.exit_code == 1 and result.output.endswith(f"Error: {out}: already exists; pick a new file name\n")
    assert saved.read_text() == before and (tmp_path / "other.json").read_text() == "[]"
    fresh = tmp_path / "new.json"
    assert run_cli("checkpoint", "redist", saved, fresh, "--new-world-size", "2").exit_code == 0
    assert [s["rank"] for s in json.loads(fresh.read_text())] == [0]


def test_state_files_of_a_folder_are_listed_in_rank_order():
    """Rank 10's file comes after rank 2's (not by text), and other files (a temporary one, a
    foreign JSON) are no state files; save/restore_loader_state and checkpoint read this list."""
    from energon_ray.loader.state_files import state_file_names

    names = ["energon_ray_loader_rank10.json", "notes.json", "energon_ray_loader_rank2.json",
             "energon_ray_loader_rank0.json.tmp123", "energon_ray_loader_rank0.json"]  # fmt: skip
    assert state_file_names(names) == [
        "energon_ray_loader_rank0.json", "energon_ray_loader_rank2.json", "energon_ray_loader_rank10.json"
    ]
