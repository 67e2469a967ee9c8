"""Which pytest worker runs which tests: what `make test`'s `--dist loadgroup` keeps together."""

import pytest


def share_module_fixtures(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a module-scoped fixture of their file (a tiny training the tests compare with) go to one
    pytest worker, which computes it once instead of each worker computing it: `--dist loadgroup` keeps tests with
    the same `xdist_group` mark together. pytest-xdist 3.8 passes the group to its controller as a suffix of the
    node id, set through `item._nodeid`, which pytest 9 no longer reads (its node ids are structured, `item._id`):
    the suffix is set here too where that is so."""
    if not getattr(config.option, "loadgroup", False):  # set in the workers, under --dist loadgroup
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        definitions = info.name2fixturedefs if info is not None else {}
        shared = sorted(n for n in item.fixturenames if any(d.scope == "module" for d in definitions.get(n, ())))
        if not shared:
            continue
        group = f"{item.path.stem}-{'-'.join(shared)}"
        item.add_marker(pytest.mark.xdist_group(group))  # pytest 8: pytest-xdist's own hook reads it
        if hasattr(item, "_id") and "@" not in item.nodeid:
            from _pytest.nodeid import NodeId  # pytest 9

            item._id = NodeId.parse(f"{item.nodeid}@{group}")
