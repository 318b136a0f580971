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
    (root / "summary.json").write_text(json.dumps({"runs": 2, "best_energy": 0.1}))  # as optimize records them
    (root / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "best_energy": [1.0 / s, 2.0 / s], "active": [True, True], "evals": [20 * s, 20 * s]}) + "\n"
        for s in range(1, 6)))
    assert render(root, root / "r.md").read_text().count("![") == 1
    from cbo_jax.report import _run_series

    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    series = _run_series(rows, "opt", 2)
    assert list(series) == ["opt run 0", "opt run 1"]
    assert [r["best_energy"] for r in series["opt run 1"]] == [2.0 / s for s in range(1, 6)]
    assert "active" not in series["opt run 0"][0]  # booleans are not curves
    mean = _run_series(rows, "opt", 2, mean=True)
    assert list(mean) == ["opt (mean of 2 runs)"] and mean["opt (mean of 2 runs)"][0]["best_energy"] == 1.5
    one = _run_series([{"step": 1, "e": [3.0]}, {"step": 2, "e": [2.0]}], "x", 1)
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


# ------------------------------------------------------------------ issue 57, items 6 and 7

def test_report_embeds_no_png_read_through_a_symbolic_link(tmp_path, capsys):
    """``out/leak.png -> secret`` embedded the secret's bytes in the page (base64)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x89PNG top secret bytes")
    root = tmp_path / "out"
    (root / "run").mkdir(parents=True)
    (root / "run" / "summary.json").write_text(json.dumps({"final_test_acc": 1.0}))
    (root / "leak.png").symlink_to(secret)
    (root / "run" / "also.png").symlink_to(secret)
    page = render(root).read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert not any(b"secret" in base64.b64decode(i) for i in images)
    assert "skipped: <code>leak.png</code>: a symbolic link" in page
    assert "skipped: <code>also.png</code>: a symbolic link" in page
    assert "skipped: run/also.png: a symbolic link" in capsys.readouterr().err
    text = render(root, tmp_path / "r.md").read_text()
    assert "skipped: `leak.png`: a symbolic link" in text
    assert not any(b"secret" in f.read_bytes() for f in tmp_path.glob("r_files/*"))
    # a directory holding only links is no results at all
    only = tmp_path / "only"
    only.mkdir()
    (only / "x.png").symlink_to(secret)
    with pytest.raises(ValueError, match=r"no results found .*1 symbolic link skipped"):
        render(only)


def test_report_shows_no_json_read_through_a_symbolic_link(tmp_path):
    """``out/leak.json -> creds.json`` showed the credentials as a table; a linked metrics.jsonl,
    summary.json or directory was read as well."""
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"password": "hunter2-secret"}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"round": r, "secret_curve": r}) + "\n" for r in (1, 2)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "summary.json").write_text(json.dumps({"leaked_key": 7}))
    root = tmp_path / "out"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        (root / name / "summary.json").write_text(json.dumps({"final_test_acc": 1.0 if name == "a" else 2.0}))
    (root / "leak.json").symlink_to(creds)
    (root / "a" / "metrics.jsonl").symlink_to(rows)
    (root / "b" / "config.json").symlink_to(creds)
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    for fmt in ("html", "md"):
        page = render(root, fmt=fmt).read_text()
        assert "hunter2" not in page and "password" not in page and "leaked_key" not in page, fmt
        assert "secret_curve" not in page and page.count("a symbolic link") == 4, fmt
    assert "skipped: <code>linked</code>: a symbolic link" in render(root).read_text()
    # nor is the report written through one: ``report.html -> ~/.bashrc`` replaced the target
    (root / "report.html").unlink()
    (root / "report.html").symlink_to(creds)
    with pytest.raises(ValueError, match="is a symbolic link"):
        render(root)
    assert "hunter2" in creds.read_text()


def _parse_md(text):
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").render(text)


def test_markdown_report_escapes_html_from_keys_values_and_names(tmp_path):
    """The Markdown report kept raw HTML from summary keys, config values and names."""
    root = tmp_path / "out"
    d = root / "<img src=x onerror=alert(1)>"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"<script>alert('key')</script>": "<img src=y onerror=alert(2)>",
                                                "link": "[click](javascript:alert(3))", "final": 1.0}))
    (d / "<b onmouseover=x>.json").write_text(json.dumps({"lr": "<iframe src=z>"}))
    (d / "two\n\n# <u onclick=x>lines.json").write_text(json.dumps({"a": 1}))  # a paragraph, a heading
    text = render(root, tmp_path / "r.md").read_text()
    for raw in ("<script", "<img", "<iframe", "[click](javascript:", "\n# "):
        assert raw not in text, raw
    assert "`<b onmouseover=x>.json`" in text  # a name: a code span, which shows its text as it is
    assert "&lt;script&gt;" in text and "&lt;img src=y onerror=alert(2)&gt;" in text
    html_out = _parse_md(text)  # as a CommonMark renderer shows it: no element from the directory
    for tag in ("<script", "<iframe", "<img", "<b ", "<u ", 'href="javascript', "<h1>&lt;u"):
        assert tag not in html_out, tag
    assert "&lt;img src=x onerror=alert(1)&gt;" in html_out  # shown as text


def test_a_backtick_in_a_name_stays_inside_its_code_span(tmp_path):
    """``a`b.json`` closed the code span at its backtick (Markdown; the HTML split its name too)."""
    root = tmp_path / "out"
    root.mkdir()
    (root / "a`b <i>.json").write_text(json.dumps({"x": 1}))
    (root / "``two`.json").write_text(json.dumps({"y": 2}))
    text = render(root, tmp_path / "r.md").read_text()
    assert "``a`b <i>.json``" in text and "``` ``two`.json ```" in text
    assert "<code>a`b &lt;i&gt;.json</code>" in render(root).read_text()
    html_out = _parse_md(text)
    assert "<code>a`b &lt;i&gt;.json</code>" in html_out and "<code>``two`.json</code>" in html_out


def _federated(root, name, rows, clusters=4):
    """A results directory as ``cbo-jax run``/``demo`` writes it: one value per round, no runs."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": name, "data": {"clusters": clusters}}))
    (d / "summary.json").write_text(json.dumps({"algorithm": name, "rounds": len(rows), "num_clusters": clusters,
                                                "final_test_acc": rows[-1]["test_acc"]}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r + 1, **row}) + "\n" for r, row in enumerate(rows)))
    return d


def _demo_like(tmp_path):
    root = tmp_path / "demo"
    _federated(root, "fedcbo", [
        {"train_loss": 2.0, "test_acc": 40.0, "test_acc_per_cluster": [30.0, 40.0, 45.0, 45.0]},
        {"train_loss": 1.5, "test_acc": 50.0, "test_acc_per_cluster": [38.0, 59.0, 54.0, 49.0]}])
    _federated(root, "ifca", [{"train_loss": 1.9, "test_acc": 45.0, "test_acc_per_cluster": [40.0, 50.0, 45.0, 45.0],
                               "server_model_per_cluster": [0, 1, 2, 1]},
                              {"train_loss": 1.4, "test_acc": 63.0, "test_acc_per_cluster": [72.0, 55.0, 73.0, 52.0],
                               "server_model_per_cluster": [3, 1, 2, 1]}])
    return root


@pytest.fixture
def drawn(monkeypatch):
    """The series each figure was given and the figures drawn, as ``[(series, fig)]``."""
    import cbo_jax._plotting as plotting
    from cbo_jax import report

    seen, figs = [], []
    original, subplots = report._curves_png, plotting.subplots

    def spy(series, title, *a, **k):
        seen.append(series)
        return original(series, title, *a, **k)

    def spy_subplots(*a, **k):
        fig, axes = subplots(*a, **k)
        figs.append(fig)
        return fig, axes

    monkeypatch.setattr(report, "_curves_png", spy)
    monkeypatch.setattr(plotting, "subplots", spy_subplots)
    return seen, figs


def _panel(fig, title):
    (ax,) = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def test_the_runs_of_a_run_are_counted_from_its_directory_not_from_a_list(tmp_path, drawn):
    """The demo's legend said "(mean of 4 runs)" for methods that ran once: any 4-element list
    (4 clusters) was taken for 4 runs."""
    seen, _ = drawn
    render(_demo_like(tmp_path))
    assert [sorted(s) for s in seen] == [["fedcbo", "ifca"]]
    # optimize records its runs (summary.json "runs", config.json options.runs): 3 runs, 4 coordinates
    opt = tmp_path / "opt"
    opt.mkdir()
    (opt / "summary.json").write_text(json.dumps({"runs": 3, "best_energy": 0.1}))
    (opt / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "best_energy": [1.0 / s, 2.0 / s, 3.0 / s], "consensus": [[0.0] * 4] * 3}) + "\n"
        for s in (1, 2)))
    seen.clear()
    render(opt)
    assert sorted(seen[0]) == ["opt run 0", "opt run 1", "opt run 2"]
    # simulate(..., out=) without num_runs: a 4-vector per step is not 4 runs
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "summary.json").write_text(json.dumps({"num_runs": None, "steps": 2}))
    (sim / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "best_energy": 1.0 / s, "consensus": [s, 2 * s, 3 * s, 4 * s]}) + "\n" for s in (1, 2)))
    seen.clear()
    render(sim)
    assert list(seen[0]) == ["sim"] and seen[0]["sim"][1]["consensus"] == [2, 4, 6, 8]


def test_per_cluster_quantities_are_drawn_one_line_per_cluster(tmp_path, drawn):
    """``test_acc_per_cluster`` was drawn as the mean of the clusters (a copy of ``test_acc``)."""
    _, figs = drawn
    render(_demo_like(tmp_path))
    ax = _panel(figs[0], "test_acc_per_cluster")
    lines = {(line.get_label(), tuple(line.get_ydata())) for line in ax.get_lines()}
    assert ("fedcbo", (30.0, 38.0)) not in lines  # not one line per method
    ys = sorted(tuple(line.get_ydata()) for line in ax.get_lines())
    assert ys == sorted([(30.0, 38.0), (40.0, 59.0), (45.0, 54.0), (45.0, 49.0),
                         (40.0, 72.0), (50.0, 55.0), (45.0, 73.0), (45.0, 52.0)])


def test_categorical_values_are_never_averaged(tmp_path, drawn):
    """``server_model_per_cluster`` (cluster indices [3, 1, 2, 1]) was drawn as their mean, 1.75."""
    seen, figs = drawn
    render(_demo_like(tmp_path))
    ax = _panel(figs[0], "server_model_per_cluster")
    ys = sorted(tuple(line.get_ydata()) for line in ax.get_lines())
    assert ys == [(0, 3), (1, 1), (1, 1), (2, 2)]
    assert all(line.get_drawstyle().startswith("steps") for line in ax.get_lines())
    # nor over seeds (METHOD/seedK) or runs: an index has no mean
    root = tmp_path / "table"
    for k, models in enumerate(([0, 1], [1, 1])):
        d = root / "ifca" / f"seed{k}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"final_test_acc": 50.0 + k, "final_assignment": k}))
        (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_acc": 50.0 + k,
                                                     "server_model_per_cluster": models}) + "\n"
                                         + json.dumps({"round": 2, "test_acc": 60.0 + k}) + "\n")
    (root / "fedavg" / "seed0").mkdir(parents=True)
    (root / "fedavg" / "seed0" / "summary.json").write_text(json.dumps({"final_test_acc": 40.0,
                                                                         "final_assignment": 0}))
    (root / "fedavg" / "seed0" / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_acc": 40.0}) + "\n")
    seen.clear()
    text = render(root, tmp_path / "r.md").read_text()
    rows = seen[0]["ifca (mean of 2)"]
    assert rows[0]["test_acc"] == 50.5 and "server_model_per_cluster" not in rows[0]
    assert not re.search(r"\|\s*0\.5\s*\|", text.split("## fedavg")[0])  # final_assignment: 0 and 1, no mean
    opt = tmp_path / "opt"
    for name in ("a", "b"):
        (opt / name).mkdir(parents=True)
        (opt / name / "summary.json").write_text(json.dumps({"runs": 2, "x": 1 if name == "a" else 2}))
        (opt / name / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": s, "best_energy": [1.0, 2.0], "best_index": [0, 3]}) + "\n" for s in (1, 2)))
    seen.clear()
    render(opt)
    assert seen[0]["a (mean of 2 runs)"][0] == {"step": 1, "best_energy": 1.5}
