package dataset

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/riffle-ml/riffle/cache"
)

// lz4Arrow writes an LZ4-compressed IPC file of batches record batches of
// 100 rows (a string of 200 bytes and a list each) and opens it.
func lz4Arrow(t *testing.T, batches int) *packedArrow {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "l", Type: arrow.ListOf(arrow.PrimitiveTypes.Int64), Nullable: true}}, nil)
	p := filepath.Join(t.TempDir(), "z.arrow")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc), ipc.WithLZ4())
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for b := range batches {
		var rows []string
		for i := range 100 {
			rows = append(rows, fmt.Sprintf(`{"s":"%d %s","l":[%d,%d]}`, b*100+i, strings.Repeat(string(rune('a'+r.IntN(26))), 200), r.Int64(), i))
		}
		rec, _, err := array.RecordFromJSON(memory.NewGoAllocator(), sc, strings.NewReader("["+strings.Join(rows, ",")+"]"))
		if err != nil {
			t.Fatal(err)
		}
		w.Write(rec)
		rec.Release()
	}
	w.Close()
	f.Close()
	ds, err := Open(context.Background(), Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	return ds.(*packedArrow)
}

// shuffledBatches reads every row in a shuffled order, in batches of 37,
// and returns each batch's message.
func shuffledBatches(t *testing.T, d *packedArrow) [][]byte {
	t.Helper()
	ids := rand.New(rand.NewPCG(3, 4)).Perm(d.Len())
	var out [][]byte
	for i := 0; i < len(ids); i += 37 {
		msg, _, err := ReadRows(context.Background(), d, ids[i:min(i+37, len(ids))])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, msg)
	}
	return out
}

// Decompressed batches that do not fit the cache's budget are handed to
// the batches waiting for them and not kept: readers at once over a cache
// that holds about one of six batches get every row as readers over a
// roomy one do.
func TestUnpackedOverBudget(t *testing.T) {
	d := lz4Arrow(t, 6)
	want := shuffledBatches(t, d)
	d.unpacked = cache.New(cache.Options{Budget: 30 << 10, Policy: cache.LRU{}})
	var wg sync.WaitGroup
	got := make([][][]byte, 4)
	for i := range got {
		wg.Go(func() { got[i] = shuffledBatches(t, d) })
	}
	wg.Wait()
	for i := range got {
		for k := range want {
			if !bytes.Equal(got[i][k], want[k]) {
				t.Fatalf("reader %d, batch %d differs from a read over a roomy cache", i, k)
			}
		}
	}
	// Full: a block evicted another, or, with the one it would evict
	// pinned by a batch still using it, was handed over and not kept
	// (which of the two depends on the readers' timing).
	if st := d.unpacked.Stats(); st.Bytes > st.Budget || st.Evictions+st.Refused == 0 {
		t.Fatalf("cache %+v: over its budget, or never full", st)
	}
}

// A batch waiting for record batches another claimed reads them itself
// when that one gives up (its loader stopped) instead of waiting forever.
func TestUnpackedAbandonedClaim(t *testing.T) {
	d := lz4Arrow(t, 3)
	ids := []int{5, 150, 299, 6}
	want, _, err := ReadRows(context.Background(), d, ids)
	if err != nil {
		t.Fatal(err)
	}
	d.unpacked = newUnpackedCache() // nothing decompressed yet
	a, err := d.BatchOf(ids)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.BatchOf(ids)
	if err != nil {
		t.Fatal(err)
	}
	if locs := b.Cells(0, nil); locs[0].Len != 0 {
		t.Fatalf("the second batch reads %v of a record batch the first claimed", locs[0])
	}
	a.Release()
	start := time.Now()
	got, err := readPlanned(context.Background(), d, b, len(ids))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("rows differ after the claim was given up")
	}
	if time.Since(start) > claimWait/2 {
		t.Fatalf("waited %v for a claim given up", time.Since(start))
	}
}

// A batch waiting for several record batches another batch claimed and
// holds without reading (its loader stalled, not stopped) waits once, for
// claimWait, then reads every one of them itself: the deadline is the
// batch's, not one block's, so the second block is not waited on for ever.
func TestUnpackedStalledClaims(t *testing.T) {
	d := lz4Arrow(t, 3)
	ids := []int{5, 150, 299, 6}
	want, _, err := ReadRows(context.Background(), d, ids)
	if err != nil {
		t.Fatal(err)
	}
	d.unpacked = newUnpackedCache()
	a, err := d.BatchOf(ids)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	b, err := d.BatchOf(ids)
	if err != nil {
		t.Fatal(err)
	}
	// A hang guard, not a speed bound: the wait is claimWait, once.
	ctx, cancel := context.WithTimeout(context.Background(), 20*claimWait)
	defer cancel()
	got, err := readPlanned(ctx, d, b, len(ids))
	if err != nil {
		t.Fatalf("a batch behind stalled claims: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("rows differ when read past stalled claims")
	}
}
