"""Join the JSON outputs of one skeleton run into one JSON and one markdown page:
``python3 devtools/skeleton_pages.py TMPDIR OUT.json OUT.md`` reads TMPDIR/bw.json
(``devtools/bandwidth_skeletons.py --json``), TMPDIR/lat.json and TMPDIR/sweep.json
(``devtools/latency_skeletons.py --json``, the routing rows and their config sweep); a missing
part is noted on the page."""
import json
import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bandwidth_skeletons as bs  # noqa: PLC0415 - the scripts next to this file
    import latency_skeletons as ls  # noqa: PLC0415

    tmp, out_json, out_md = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    parts = {}
    for name in ("lat", "bw", "sweep"):
        p = tmp / f"{name}.json"
        parts[name] = json.loads(p.read_text()) if p.exists() else None
    out_json.write_text(json.dumps(parts, indent=1))
    md = [bs.markdown(parts["bw"]) if parts["bw"] else "(bandwidth part missing: see skel.log)\n"]
    for name in ("lat", "sweep"):
        res = parts[name]
        if not res:
            md.append(f"({name} part missing: see skel.log)\n")
            continue
        if name == "sweep":   # the floor row is already in the first routing table
            res = {**res, "rows": [r for r in res["rows"] if r["skeleton"] != "floor"]}
        md.append(ls.markdown(res))
    out_md.write_text("\n".join(md))


if __name__ == "__main__":
    main()
