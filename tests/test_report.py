"""`autopar show` (rich tables) and `autopar report --html` (one self-contained page, checked in a
real headless Chromium: it renders, its script runs without error, and the screenshot is not blank)."""
import dataclasses
import re
import shutil
import struct
import subprocess
import zlib
from html import escape

import numpy as np
import pytest
import torch

import autopar
from autopar.cli import main as cli
from autopar.inspect.report_html import render_html
from autopar.inspect.report_offload import MAX_ROWS
from autopar.units import human_bytes, human_seconds
from examples import gpt2
from tests.moe_workers import no_expert_parallelism
from tests.test_extend import Constrain
from tests.workers import FAST

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    model, inputs = gpt2.make("tiny")  # nested modules (blocks.0.attn.q) and sharded layers on tp=2
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST)
    assert plan.collectives() and not all(plan.param_spec(f).is_replicated() for f in plan.graph.params.values())
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(plan.to_json())
    return plan, path


def test_show_prints_layers_placements_step_time_and_collectives(plan_file, capsys):
    plan, path = plan_file
    assert cli(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: plain text
    assert re.search(rf"step time +{re.escape(human_seconds(plan.predicted.step_time_s))} = compute", out)
    spec = str(plan.param_spec("blocks.0.fc.weight"))
    assert re.search(r"blocks\.0\.fc +. weight \[512, 128\] " + re.escape(spec), out), out
    (costliest, step), *_ = sorted(plan.collectives(), key=lambda c: -c[0].step_seconds[c[1]])
    assert re.search(rf"{costliest.phase} +. {costliest.steps[step].kind} +. tp +. {costliest.value} ", out), out


def test_show_and_report_explain_a_missing_or_corrupt_plan_file(tmp_path, capsys):
    assert cli(["show", str(tmp_path / "none.json")]) == 2
    assert "cannot read the plan file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"format_version": 1, "mesh": {}}')
    assert cli(["report", str(tmp_path / "bad.json"), "--html", str(tmp_path / "r.html")]) == 2
    assert "the plan file is corrupt" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_is_self_contained_and_escapes_names(plan_file, tmp_path, capsys):
    plan, path = plan_file
    out = tmp_path / "report.html"
    assert cli(["report", str(path), "--html", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report of plan {plan.hash} written to {out}"
    page = out.read_text()
    assert "http://" not in page and "https://" not in page  # no network: no fonts, scripts or images fetched
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", page)
    assert str(plan.param_spec("blocks.0.fc.weight").placements[0]) in page
    owners = [fqn.rpartition(".")[0] for fqn in plan.graph.params.values()]
    modules = {""} | {p for m in [*plan.modules.values(), *owners] for p in _prefixes(m)}
    assert page.count('<details class="mod"') == len(modules)  # one tree node per module
    hostile = dataclasses.replace(plan, modules={n: "<img src=x>" for n in plan.modules})
    assert "<img src=x>" not in render_html(hostile) and "&lt;img src=x&gt;" in render_html(hostile)


@pytest.fixture(scope="module")
def offload_plan():
    model, inputs = gpt2.make("tiny")  # a budget under what any layout needs: parameters go to host memory
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g", memory_budget=4.3e6)
    assert plan.offload is not None and 1 < len(plan.offload.chunks) <= MAX_ROWS
    return plan


def test_report_shows_the_offload_figures_device_bytes_and_each_chunks_residence(offload_plan, plan_file):
    o = offload_plan.offload
    page = render_html(offload_plan)
    section = re.search(r'<section class="offload">.*?</section>', page, re.S).group(0)
    assert f"{len(o.chunks)} chunks × {human_bytes(o.chunk_bytes)} in host memory" in section
    assert f"host {human_bytes(o.host_bytes)} per device" in section and f"at most {o.slots} on the device" in section
    assert f"{o.fetches} fetches per step, {human_bytes(o.fetches * o.chunk_bytes)} host → device" in section
    assert f"adds {human_seconds(o.added_s)} per step: waits for fetches {human_seconds(o.exposed_s)}" in section
    assert human_seconds(o.optimizer.device_s) in section and escape(o.reason) in section
    assert "<polyline" in section  # the chunk bytes on the device over the statements
    rows = re.findall(r'<g class="chunk">(.*?)</g>', section, re.S)
    assert len(rows) == len(o.chunks)
    first = o.chunks[0]
    assert f"chunk 0: {first.params[0]}" in rows[0] and f"{human_bytes(first.nbytes)})" in rows[0]
    for chunk, row in zip(o.chunks, rows):  # one bar per span on the device
        assert row.count("on the device from statement") == len(o.residence(chunk.index, len(o.device_bytes)))
    assert 'class="offload"' not in render_html(plan_file[0])  # nothing offloaded, no section


def test_report_caps_the_offload_rows(offload_plan):
    o = offload_plan.offload
    many = tuple(dataclasses.replace(o.chunks[k % len(o.chunks)], index=k) for k in range(MAX_ROWS + 25))
    page = render_html(dataclasses.replace(offload_plan, offload=dataclasses.replace(o, chunks=many)))
    assert page.count('<g class="chunk">') == MAX_ROWS and "… 25 more chunks" in page


def test_report_marks_each_mixture_of_experts_layer_with_its_layout():
    """Each MoE layer's module carries its layout; under expert parallelism its op rows show the
    all-to-alls that run inside the op (forward and backward)."""
    from examples import hf_zoo

    torch.manual_seed(0)
    model, batch = hf_zoo.mixtral()
    layers = sum(type(m).__name__.endswith("Experts") for m in model.modules())
    expert_parallel = autopar.plan(model, batch, mesh="ep=4", hardware=FAST)
    page = render_html(expert_parallel)
    assert page.count("MoE: expert parallel over ep") == layers > 0
    assert page.count("⇄ all_to_all[ep] inside") == 2 * layers
    replicated = render_html(autopar.plan(model, batch, mesh="ep=4", hardware="h100-sxm", cache=False,
                                          passes=[Constrain(no_expert_parallelism, name="no-ep")]))
    assert "MoE: expert parallel" not in replicated and "all_to_all[ep] inside" not in replicated
    assert replicated.count('<span class="moe"') == layers


def _prefixes(path: str):
    parts = path.split(".") if path else []
    return {".".join(parts[:k]) for k in range(1, len(parts) + 1)}


@pytest.fixture(scope="module")
def chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no chromium on PATH (CI installs Debian's: apt-get install chromium)")
    return found


def _browse(chromium, page, tmp_path, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,900", *flags, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)


# what a reader does: filter the tree, expand it, point at the memory chart; results land on <body>
EXERCISE = """<script>
var input = document.getElementById('filter');
input.value = 'attn.q'; input.dispatchEvent(new Event('input'));
document.body.dataset.shown = document.querySelectorAll('tr.row:not(.hidden)').length;
document.getElementById('expand').click();
document.body.dataset.closed = document.querySelectorAll('details:not([open])').length;
var box = document.getElementById('memory').getBoundingClientRect();
document.getElementById('memory').dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + box.width / 2,
                                                                            clientY: box.top + box.height / 2}));
document.body.dataset.readout = document.getElementById('readout').textContent;
</script></body>"""


@pytest.mark.browser
def test_report_renders_in_a_headless_browser(plan_file, chromium, tmp_path):
    plan, _ = plan_file
    page = tmp_path / "report.html"
    page.write_text(render_html(plan))
    exercised = tmp_path / "exercised.html"
    exercised.write_text(render_html(plan).replace("</body>", EXERCISE))
    dom = _browse(chromium, exercised, tmp_path, "--dump-dom").stdout
    root = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-ready="1"' in root  # the page's script ran to its end
    assert "data-js-errors" not in root, root  # and nothing on the page raised
    body = re.search(r"<body[^>]*>", dom).group(0)
    # the filter leaves the q projections' parameters and ops (blocks.0.attn.q.weight, ...), not all rows
    shown = int(re.search(r'data-shown="(\d+)"', body).group(1))
    assert 0 < shown < dom.count('<tr class="row'), body
    assert 'data-closed="0"' in body  # expand all opened every module
    assert re.search(r'data-readout="after \S+: [\d.]+ [KMG]?B live"', body), body

    png = tmp_path / "report.png"
    _browse(chromium, page, tmp_path, f"--screenshot={png}")
    pixels = _png_pixels(png.read_bytes())
    assert pixels.shape[:2] == (900, 1200)
    colours = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)
    non_white = (pixels.min(axis=2) < 235).mean()
    assert len(colours) > 200 and non_white > 0.1, (len(colours), non_white)  # text, chips, charts: not blank


@pytest.mark.browser
def test_an_offloading_plans_report_renders_without_script_errors(offload_plan, chromium, tmp_path):
    page = tmp_path / "offload.html"
    page.write_text(render_html(offload_plan))
    root = re.search(r"<html[^>]*>", _browse(chromium, page, tmp_path, "--dump-dom").stdout).group(0)
    assert 'data-ready="1"' in root and "data-js-errors" not in root, root


@pytest.mark.browser
def test_the_browser_check_sees_script_errors(plan_file, chromium, tmp_path):
    plan, _ = plan_file
    page = tmp_path / "broken.html"
    page.write_text(render_html(plan).replace("</body>", "<script>window.noSuchFunction();</script></body>"))
    dom = _browse(chromium, page, tmp_path, "--dump-dom").stdout
    assert re.search(r'<html[^>]*data-js-errors="[^"]*noSuchFunction', dom)


def _png_pixels(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGB or RGBA PNG (what Chromium writes) into an (height, width, channels) array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunks[kind] = chunks.get(kind, b"") + data[pos + 8:pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
    bpp = 3 if colour_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), np.uint8)
    prior = np.zeros(width * bpp, np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:
            row = line
        elif kind == 1:  # Sub: running sum per channel
            row = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        elif kind == 2:  # Up
            row = (line + prior) % 256
        else:  # Average and Paeth read the byte just decoded on the left: one at a time
            row = _unfilter_sequential(kind, line.tolist(), prior.tolist(), bpp)
        out[y] = row
        prior = np.asarray(row, np.int32)
    return out.reshape(height, width, bpp)


def _unfilter_sequential(kind: int, line: list, up: list, bpp: int) -> list:
    row = [0] * len(line)
    for i, x in enumerate(line):
        a = row[i - bpp] if i >= bpp else 0
        c = up[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            row[i] = (x + (a + b) // 2) & 255
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return row
