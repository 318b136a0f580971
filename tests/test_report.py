"""`cbo-jax reproduce --list` (the catalogue) and `cbo-jax report` (results to one file)."""

import base64
import json
import re

import pytest

from cbo_jax import cli
from cbo_jax.experiments import catalog, registry
from cbo_jax.report import flatten, render


def test_every_reproduction_has_a_recorded_measurement_and_headline_keys():
    names = set(registry())
    assert names == set(catalog.RECORDED), names ^ set(catalog.RECORDED)
    assert names == set(catalog.HEADLINE_KEYS), names ^ set(catalog.HEADLINE_KEYS)
    for rec in catalog.RECORDED.values():
        assert rec.command.split("cbo-jax reproduce ")[1].split()[0] in names
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", rec.date)


def test_headline_follows_nested_keys_and_skips_missing_ones():
    summary = {"scale": "small", "fedcb2o": {"asr": 2.85, "source_acc": 87.7}, "fedcbo": {"asr": 5.55},
               "oracle_min": {"source_acc": 87.94}}
    text = catalog.headline("fedcb2o-attack", summary)
    assert text == ("scale=small, fedcb2o.asr=2.85, fedcbo.asr=5.55, fedcb2o.source_acc=87.7, "
                    "oracle_min.source_acc=87.94")
    # unknown reproduction: the top-level numbers, not the timing
    assert catalog.headline("other", {"a": 1, "b": [1], "wall_seconds": 3.0, "c": 1.5e-5}) == "a=1, c=1.5e-05"


def test_list_shows_published_recorded_and_the_last_local_run(tmp_path, capsys):
    run_dir = tmp_path / "meanfield-scaling"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"slope": -0.4871, "sizes": [100, 1000]}))
    (tmp_path / "cb2o-malicious").mkdir()
    (tmp_path / "cb2o-malicious" / "summary.json").write_text("{not json")
    assert cli.main(["reproduce", "--list", "--results-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name, exp in registry().items():
        assert name in out and exp.published in out
    block = out[out.index("meanfield-scaling"):out.index("cb2o-malicious")]
    assert f"recorded:   {catalog.RECORDED['meanfield-scaling'].measured}" in block
    assert "last run:   slope=-0.4871" in block
    assert "last run:   unreadable" in out
    assert f"none under {tmp_path / 'clustered-consensus'}" in out


def test_reproductions_markdown_has_one_row_per_reproduction(tmp_path):
    md = catalog.reproductions_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == len(registry())
    assert all(line.count(" | ") == 5 for line in rows)  # six cells, pipes inside cells escaped
    assert "your last run" in catalog.reproductions_markdown(tmp_path)


def _results(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = tmp_path / "results"
    for name, acc in (("fedcbo", [50.0, 80.0, 91.5]), ("fedavg", [40.0, 60.0, 70.25])):
        d = root / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"algorithm": name, "final_test_acc": acc[-1], "rounds": 3,
                                                    "per_cluster": [acc[-1]] * 2, "nested": {"x": 1}}))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r + 1, "test_acc": a, "eps": 0.5,
                                                             "selection": [[1, 0], [0, 1]]}) + "\n"
                                                 for r, a in enumerate(acc)) + "garbage line\n")
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(root / "fedcbo" / "accuracy.png")
    plt.close(fig)
    (root / "demo.json").write_text(json.dumps({"fedcbo": 91.5, "fedavg": 70.25}))
    (root / "fedcbo" / "checkpoint").mkdir()
    (root / "fedcbo" / "checkpoint" / "meta.json").write_text(json.dumps({"hidden": 1}))
    return root


def test_html_report_is_self_contained_with_tables_comparison_and_curves(tmp_path):
    root = _results(tmp_path)
    path = render(root)
    assert path == root / "report.html"
    page = path.read_text()
    assert "<table>" in page and "final_test_acc" in page and "70.25" in page
    # comparison of the two methods: one row each, only what differs
    assert "<td>fedavg</td><td>70.25</td>" in page and "<td>fedcbo</td><td>91.5</td>" in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2  # the overlaid curves and fedcbo/accuracy.png
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "hidden" not in page  # checkpoints are skipped
    assert "nested.x" in page and "[2 values]" not in page and "[91.5, 91.5]" in page


def test_markdown_report_writes_images_beside_it_and_rerenders_cleanly(tmp_path):
    root = _results(tmp_path)
    out = tmp_path / "out" / "rep.md"
    for _ in range(2):  # a second render must not pick up the first one's images
        assert render(root, out) == out
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 2 and all((out.parent / link).is_file() for link in links)
    assert text.count("## fedcbo") == 1 and "| fedavg | 70.25 |" in text
    inside = render(root, root / "report.md")
    assert render(root, inside).read_text().count("![") == 2


def test_report_cli_and_bad_input(tmp_path, capsys):
    root = _results(tmp_path)
    assert cli.main(["report", str(root), "--format", "md"]) == 0
    assert capsys.readouterr().out.strip() == str(root / "report.md")
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fmt"):
        render(root, fmt="pdf")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no results found in"):  # an empty page and status 0 hid a wrong path
        render(empty)
    assert cli.main(["report", str(empty)]) == 2 and not (empty / "report.html").exists()
    assert "no results found" in capsys.readouterr().err
    # -o over a run's own files replaced them with the report
    rows = (root / "fedcbo" / "metrics.jsonl").read_text()
    for target in (root / "fedcbo" / "metrics.jsonl", root / "fedcbo" / "accuracy.png", root / "new.json"):
        assert cli.main(["report", str(root), "-o", str(target)]) == 2
        assert "will not write the report" in capsys.readouterr().err
    assert (root / "fedcbo" / "metrics.jsonl").read_text() == rows and not (root / "new.json").exists()
    assert render(root, root / "fedcbo" / "report.md").suffix == ".md"  # a report over a report: fine


def test_curves_of_runs_written_as_lists_over_runs(tmp_path):
    """cbo-jax optimize (and simulate(..., out=) with num_runs) write each value as a list over
    runs, also for one run: the report drew no curve for them."""
    root = tmp_path / "opt"
    root.mkdir()
    (root / "summary.json").write_text(json.dumps({"best_energy": [0.1, 0.2]}))
    (root / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "best_energy": [1.0 / s, 2.0 / s], "active": [True, True], "evals": [20 * s, 20 * s]}) + "\n"
        for s in range(1, 6)))
    assert render(root, root / "r.md").read_text().count("![") == 1
    from cbo_jax.report import _run_series

    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    series = _run_series(rows, "opt")
    assert list(series) == ["opt run 0", "opt run 1"]
    assert [r["best_energy"] for r in series["opt run 1"]] == [2.0 / s for s in range(1, 6)]
    assert "active" not in series["opt run 0"][0]  # booleans are not curves
    mean = _run_series(rows, "opt", mean=True)
    assert list(mean) == ["opt (mean of 2 runs)"] and mean["opt (mean of 2 runs)"][0]["best_energy"] == 1.5
    one = _run_series([{"step": 1, "e": [3.0]}, {"step": 2, "e": [2.0]}], "x")
    assert one == {"x": [{"step": 1, "e": 3.0}, {"step": 2, "e": 2.0}]}


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": list(range(20)), "e": [{"x": 1}]}) == {
        "a.b": 1, "a.c": [1, 2], "d": "[20 values]", "e": "[1 values]"}


def test_report_names_an_unreadable_summary(tmp_path, capsys):
    """A corrupt summary.json is reported (page and stderr), not silently dropped."""
    root = tmp_path / "results"
    (root / "run1").mkdir(parents=True)
    (root / "run1" / "summary.json").write_text("{bad")
    assert cli.main(["report", str(root)]) == 0
    page = (root / "report.html").read_text()
    assert "<h2>run1</h2>" in page and "unreadable: <code>summary.json</code>: Expecting property name" in page
    err = capsys.readouterr().err
    assert "unreadable: run1/summary.json: Expecting property name" in err
    text = render(root, fmt="md").read_text()
    assert "## run1" in text and "unreadable: `summary.json`: Expecting property name" in text


def test_report_output_to_an_existing_directory(tmp_path, capsys):
    """``-o DIR`` used to fail with IsADirectoryError; the report now goes inside DIR."""
    root = _results(tmp_path)
    outdir = tmp_path / "reports"
    outdir.mkdir()
    assert cli.main(["report", str(root), "-o", str(outdir)]) == 0
    assert capsys.readouterr().out.strip() == str(outdir / "report.html")
    assert "final_test_acc" in (outdir / "report.html").read_text()
    assert render(root, outdir, fmt="md") == outdir / "report.md" and (outdir / "report_files").is_dir()


def test_an_unwritable_report_path_is_a_clear_error(tmp_path, capsys):
    # -o under a regular file was a FileExistsError traceback from the command
    root = _results(tmp_path)
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "report.html"
    assert cli.main(["report", str(root), "-o", str(bad)]) == 2
    assert f"cannot write the report to {bad}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cannot write the report"):
        render(root, bad)


def test_markdown_report_named_with_a_space_links_its_images_and_is_not_read_as_results(tmp_path):
    """A link target cannot hold a space (CommonMark): the image links are percent-encoded.
    An earlier Markdown report's image folder (``X_files/`` beside ``X.md``) inside the
    results is not a results directory (it was copied again under a section of its own)."""
    import urllib.parse

    root = _results(tmp_path)
    out = tmp_path / "sp out" / "my report.md"
    text = render(root, out).read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert len(links) == 2 and all(" " not in link for link in links)
    assert all((out.parent / urllib.parse.unquote(link)).is_file() for link in links)
    first = render(root, root / "first report.md")
    second = render(root, root / "second.md").read_text()
    assert "first report_files" not in second and second.count("![") == 2
    assert first.with_name("first report_files").is_dir()


def test_a_reproductions_methods_are_compared_by_their_runs_means(tmp_path):
    """A reproduction writes METHOD/seedK/: the method directories hold no summary of their own,
    so the report compared the seeds within each method and never one method with another."""
    root = tmp_path / "table"
    for method, accs in (("fedcbo", (90.0, 92.0)), ("fedavg", (80.0, 84.0))):
        for k, acc in enumerate(accs):
            d = root / method / f"seed{k}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"final_test_acc": acc, "rounds": 2}))
            (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_acc": acc - 10 * (2 - r)}) + "\n"
                                                     for r in (1, 2)))
    text = render(root, tmp_path / "r.md").read_text()
    top = text.split("## fedavg")[0]
    assert "by the mean over the runs below each" in top
    assert "| fedavg (mean of 2) | 82 |" in top and "| fedcbo (mean of 2) | 91 |" in top
    assert top.count("![") == 1  # the methods' mean curves, overlaid
    from cbo_jax.report import _mean_rows

    assert _mean_rows([[{"round": 1, "a": 1.0}, {"round": 2, "a": 3.0}], [{"round": 1, "a": 2.0}]]) == [
        {"round": 1, "a": 1.5}, {"round": 2, "a": 3.0}]
