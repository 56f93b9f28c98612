package job

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/wire"
)

// rowsOf reads a job's batches to the end: each epoch's rows by id, as
// arrow-go decodes them (JSON), and fails on a row twice in an epoch.
func rowsOf(j *Job) ([]map[int]string, error) {
	var epochs []map[int]string
	schema := j.Describe().Info.Schema
	for {
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return epochs, nil
		}
		if err != nil {
			return nil, err
		}
		for len(epochs) <= b.Epoch {
			epochs = append(epochs, map[int]string{})
		}
		rows, err := columnar.JSONRows(schema, b.Data[:b.Columns.Len])
		if err != nil {
			b.Release()
			return nil, err
		}
		for i, id := range b.IDs {
			if _, twice := epochs[b.Epoch][id]; twice {
				b.Release()
				return nil, errors.New("a row twice in an epoch")
			}
			epochs[b.Epoch][id] = rows[i]
		}
		b.Release()
	}
}

// Jobs with share on a dataset of rows (a Hugging Face directory) form one
// group and sample dependently: each reads every row once per epoch, equal
// to a job's reading it alone. What they share is the rows they take at
// the same time and the dataset's unpacked blocks, not record items: the
// group reserves none in the cache, which is empty once they end.
func TestSharedRows(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hf")
	const n = 900
	writeHFDir(t, dir, 0, n, 2, arrow.PrimitiveTypes.Int64)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	solo, err := rowsOf(openJob(t, env, &wire.JobSpec{Paths: []string{dir}, BatchSize: 32, Shuffle: true, Seed: 9}))
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	var jobs []*Job
	for k := range 2 {
		jobs = append(jobs, openJob(t, env, &wire.JobSpec{Paths: []string{dir}, BatchSize: 32, Shuffle: true, Seed: uint64(k + 1),
			Share: &yes, Epochs: 2}))
	}
	if gs := env.Groups(); len(gs) != 1 || len(gs[0].Jobs) != 2 {
		t.Fatalf("groups %+v, want one of both jobs", gs)
	}
	got := make([][]map[int]string, len(jobs))
	var g errgroup.Group
	for k, j := range jobs {
		if !j.Describe().Shared {
			t.Fatalf("job %d is not shared", k)
		}
		g.Go(func() error {
			defer j.Close()
			var err error
			got[k], err = rowsOf(j)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for k := range jobs {
		if len(got[k]) != 2 {
			t.Fatalf("job %d: %d epochs", k, len(got[k]))
		}
		for e, rows := range got[k] {
			if len(rows) != n {
				t.Fatalf("job %d epoch %d: %d rows of %d", k, e, len(rows), n)
			}
			for id, r := range rows {
				if r != solo[0][id] {
					t.Fatalf("job %d epoch %d row %d: %s, alone %s", k, e, id, r, solo[0][id])
				}
			}
		}
	}
	if st := env.Cache().Stats(); st.Items != 0 {
		t.Fatalf("%d items left in the cache by jobs of rows", st.Items)
	}
}
