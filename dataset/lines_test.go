package dataset_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	. "github.com/riffle-ml/riffle/dataset"
)

// Which lines are records, per format, as their usual readers take them:
// blank lines are records only in text (zero-length ones), comment lines
// are not records in LIBSVM, and a last line without its newline is one.
func TestLineRules(t *testing.T) {
	const body = "# made by dump_svmlight_file\n1 1:1\n\n  \n2 2:2 # trailing\n#x\n\n3 3:3"
	for _, c := range []struct {
		format string
		want   []string
	}{
		{"libsvm", []string{"1 1:1", "2 2:2 # trailing", "3 3:3"}},
		{"jsonl", []string{"# made by dump_svmlight_file", "1 1:1", "2 2:2 # trailing", "#x", "3 3:3"}},
		{"text", []string{"# made by dump_svmlight_file", "1 1:1", "", "  ", "2 2:2 # trailing", "#x", "", "3 3:3"}},
	} {
		t.Run(c.format, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "d")
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, pass := range []string{"built", "from the index"} {
				ds, err := Open(context.Background(), Options{Format: c.format}, p)
				if err != nil {
					t.Fatalf("%s: %v", pass, err)
				}
				var got []string
				for id := range ds.Len() {
					got = append(got, string(record(t, ds, id)))
				}
				ds.Close()
				if !slices.Equal(got, c.want) {
					t.Fatalf("%s: records %q, want %q", pass, got, c.want)
				}
			}
		})
	}
}

// A CSV file skips blank lines but keeps newlines inside quotes, and a
// last record without its newline counts.
func TestCSVRecords(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.csv")
	os.WriteFile(p, []byte("id,text\n1,\"a\n\nb\"\n\n2,c\n3,\"d\""), 0o644)
	ds, err := Open(context.Background(), Options{CSVHeader: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	var got []string
	for id := range ds.Len() {
		got = append(got, string(record(t, ds, id)))
	}
	if want := []string{"1,\"a\n\nb\"", "2,c", "3,\"d\""}; !slices.Equal(got, want) {
		t.Fatalf("records %q, want %q", got, want)
	}
}

// A record size means fixed-size records: no --format needed.
func TestRecordSizeMeansFixed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.f32")
	os.WriteFile(p, make([]byte, 260*3), 0o644)
	ds, err := Open(context.Background(), Options{RecordSize: 260}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if ds.Len() != 3 || ds.Info().Format != "fixed" {
		t.Fatalf("%d records of format %s", ds.Len(), ds.Info().Format)
	}
}
