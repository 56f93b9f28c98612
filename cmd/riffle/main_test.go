package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
)

// run executes one subcommand and returns what it printed on its output.
func run(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestDemo(t *testing.T) {
	out, err := run(t, demoCmd(), "--records", "3000", "--size", "256", "--epochs", "2", "--batch-size", "100")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "each exactly once") != 2 || !strings.Contains(out, "samples/s") {
		t.Fatalf("demo printed:\n%s", out)
	}
}

func TestDemoOnGivenData(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.jsonl")
	synth.WriteLines(p, "jsonl", 500, false)
	out, err := run(t, demoCmd(), p, "--epochs", "1")
	if err != nil || !strings.Contains(out, "500 records, each exactly once") {
		t.Fatalf("demo on a JSONL file: %v\n%s", err, out)
	}
}

func TestIndexAndInspect(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.svm")
	synth.WriteLines(p, "libsvm", 300, false)
	out, err := run(t, indexCmd(), p)
	if err != nil || !strings.Contains(out, "300 records") || !strings.Contains(out, "8.") {
		t.Fatalf("index: %v\n%s", err, out)
	}
	out, err = run(t, inspectCmd(), p, "--first", "2")
	if err != nil || !strings.Contains(out, "records:  300") || !strings.Contains(out, synth.Line("libsvm", 1)) {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("1 1:1\n")
	f.Close()
	if _, err := run(t, indexCmd(), p, "--verify"); err == nil || !strings.Contains(err.Error(), "another version") {
		t.Fatalf("verify of a stale index: %v", err)
	}
	if out, err := run(t, indexCmd(), p); err != nil || !strings.Contains(out, "301 records") {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
}

func TestBadRecordSizeIsAnError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.bin")
	os.WriteFile(p, make([]byte, 1000), 0o644)
	_, err := run(t, inspectCmd(), p, "--record-size", "64")
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "offset 960") {
		t.Fatalf("inspect of a file with a partial record: %v", err)
	}
}

func TestBenchWarm(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.bin")
	out, err := run(t, benchCmd(), p, "--create", "4MiB", "--record-size", "4096", "--mode", "warm", "--no-fio",
		"--duration", "200ms", "--sampler", "global,block", "--block-size", "65536")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"riffle ", "riffle block 65536", "pread", "sequential", "riffle / pread samples/s"} {
		if !strings.Contains(out, want) {
			t.Fatalf("bench output lacks %q:\n%s", want, out)
		}
	}
}

func TestQuality(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "o.svg")
	out, err := run(t, qualityCmd(), "--records", "2000", "--epochs", "2", "--svg", svg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "global                         100.0%") || !strings.Contains(out, "sequential                       0.0%") {
		t.Fatalf("quality printed:\n%s", out)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Fatalf("no plot: %v", err)
	}
	for _, label := range []string{"position in the epoch (records)", "record id"} {
		if !bytes.Contains(b, []byte(label)) {
			t.Fatalf("the plot has no axis %q", label)
		}
	}
}

func TestTrain(t *testing.T) {
	out, err := run(t, trainCmd(), "--synthetic", "20000", "--synthetic-dir", t.TempDir(), "--max-epochs", "4", "--sampler", "global,sequential")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	var global, seq string
	for _, l := range lines {
		if strings.HasPrefix(l, "global ") {
			global = l
		}
		if strings.HasPrefix(l, "sequential ") {
			seq = l
		}
	}
	if !strings.Contains(seq, "not in 4") || strings.Contains(global, "not in") {
		t.Fatalf("on sorted data global should reach the target and sequential not:\n%s", out)
	}
}

// A blank line in a LIBSVM file is no record and breaks no read.
func TestDemoOnBlankLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.svm")
	os.WriteFile(p, []byte("1 1:1\n\n2 2:2\n"), 0o644)
	out, err := run(t, demoCmd(), p, "--epochs", "1")
	if err != nil || !strings.Contains(out, "2 records, each exactly once") {
		t.Fatalf("demo on a file with a blank line: %v\n%s", err, out)
	}
}

// inspect checks the CRCs of the TFRecords it shows, unless --skip-crc.
func TestInspectChecksTFRecordCRC(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.tfrecord")
	synth.WriteTFRecord(p, 3)
	b, _ := os.ReadFile(p)
	b[20] ^= 1 // inside the first record's data
	os.WriteFile(p, b, 0o644)
	if _, err := run(t, inspectCmd(), p); err == nil || !strings.Contains(err.Error(), "CRC") || !strings.Contains(err.Error(), p) {
		t.Fatalf("inspect of a corrupt TFRecord: %v", err)
	}
	if out, err := run(t, inspectCmd(), p, "--skip-crc"); err != nil || !strings.Contains(out, "records:  3") {
		t.Fatalf("inspect --skip-crc: %v\n%s", err, out)
	}
}

// index --verify says it verified the index, not the data; --data reads
// and checks the records too.
func TestIndexVerifySaysWhat(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.tfrecord")
	synth.WriteTFRecord(p, 30)
	if _, err := run(t, indexCmd(), p); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, indexCmd(), p, "--verify")
	if err != nil || !strings.Contains(out, "index verified") || !strings.Contains(out, "records not read") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	out, err = run(t, indexCmd(), p, "--verify", "--data")
	if err != nil || !strings.Contains(out, "data verified: 30 records read, each CRC checked") {
		t.Fatalf("verify --data: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(p)
	b[len(b)-6] ^= 1
	os.WriteFile(p, b, 0o644)
	if _, err := run(t, indexCmd(), p, "--data"); err == nil || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("--data over a corrupt record: %v", err)
	}
}

// A record size means fixed: no --format needed.
func TestRecordSizeImpliesFixed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.f32")
	os.WriteFile(p, make([]byte, 260*4), 0o644)
	out, err := run(t, inspectCmd(), p, "--record-size", "260")
	if err != nil || !strings.Contains(out, "format:   fixed") || !strings.Contains(out, "records:  4") {
		t.Fatalf("inspect with --record-size: %v\n%s", err, out)
	}
}

// Errors name the flag a user types.
func TestErrorsNameFlags(t *testing.T) {
	p := filepath.Join(t.TempDir(), "odd.bin")
	os.WriteFile(p, make([]byte, 1000), 0o644)
	_, err := run(t, inspectCmd(), p, "--record-size", "64")
	if err == nil || !strings.Contains(err.Error(), "--drop-partial") || strings.Contains(err.Error(), "DropPartialTail") {
		t.Fatalf("partial record: %v", err)
	}
}

// riffle pack takes a GZIP-compressed TFRecord file (which does not open
// as a dataset) by reading it start to end: the packed records are the
// source's, in order.
func TestPackCompressedTFRecord(t *testing.T) {
	dir := t.TempDir()
	var plain []byte
	var recs [][]byte
	for i := range 300 {
		r := bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 1+(i*53)%900)
		recs = append(recs, r)
		plain = dataset.AppendTFRecord(plain, r)
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write(plain)
	w.Close()
	src := filepath.Join(dir, "d.tfrecord")
	if err := os.WriteFile(src, z.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "packed")
	if _, err := run(t, packCmd(), src); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Fatalf("pack without --out: %v", err)
	}
	got, err := run(t, packCmd(), src, "--out", out, "--shard-bytes", "64KiB")
	if err != nil || !strings.Contains(got, "300 records") {
		t.Fatalf("pack: %v\n%s", err, got)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if ds.Len() != len(recs) {
		t.Fatalf("%d records packed, want %d", ds.Len(), len(recs))
	}
	for id, want := range recs {
		loc := ds.Locate(id)
		b := make([]byte, loc.Len)
		if err := ds.Object(loc.Object).ReadAt(context.Background(), b, loc.Off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("record %d differs from the source's", id)
		}
	}
}

// index --dedup hashes every record once, counts the distinct ones, and
// keeps the hashes: a second run reads none.
func TestIndexDedup(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.jsonl")
	if err := os.WriteFile(p, []byte("{\"a\":1}\n{\"a\":2}\n{\"a\":1}\n{\"a\":3}\n{\"a\":2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, indexCmd(), p, "--dedup", "--index-dir", dir)
	if err != nil || !strings.Contains(out, "dedup: 3 distinct of 5 records; hashed in") {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err = run(t, indexCmd(), p, "--dedup", "--index-dir", dir)
	if err != nil || !strings.Contains(out, "dedup: 3 distinct of 5 records; kept from before") {
		t.Fatalf("%v\n%s", err, out)
	}
}
