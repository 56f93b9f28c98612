// Writes an Arrow IPC file with apache-arrow's JavaScript writer, for
// riffle's tests: node write_arrow.mjs OUT N
import { writeFileSync } from "node:fs";
import { tableFromArrays, tableToIPC } from "apache-arrow";

const [out, nArg] = process.argv.slice(2);
const n = Number(nArg);
const id = Int32Array.from({ length: n }, (_, i) => i);
const score = Float64Array.from({ length: n }, (_, i) => i / 7);
const text = Array.from({ length: n }, (_, i) => "row " + i + " " + "x".repeat(i % 13));
writeFileSync(out, tableToIPC(tableFromArrays({ id, score, text }), "file"));
