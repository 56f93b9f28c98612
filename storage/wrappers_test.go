package storage_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
	"github.com/riffle-ml/riffle/storage/tier"
)

// A file opened through each wrapper keeps what the wrapper says it
// keeps: its version always (it is a Reader's), its Drop, descriptor,
// device and io_uring path through a wrapper that unwraps (Faulty, over a
// file or a FileSet's file), none of them through a cache in front of it
// (the disk tier, the nodes' memory), whose reads they would go around.
// Its bytes are the file's through an engine, and a Faulty's faults reach
// the engine's reads through whatever it wraps. (Faulty lost the version,
// Drop and the descriptor: an index built through it was keyed without
// them, and the steward was off in every fault test.)
func TestWrappersKeepTheirReader(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	data := synth.RandomBytes(3<<20+17, 7)
	path := filepath.Join(dir, "d.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	local, err := storage.NewLocal(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	r, err := local.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	file := r.(*storage.File)
	version, dev := file.Version(), storage.DeviceOf(file)
	if version == "" || dev == 0 {
		t.Fatalf("a local file has version %q on device %d", version, dev)
	}

	set := storage.NewFileSet(local, []string{path}, []int64{int64(len(data))}, 1)
	defer set.Close()
	tr, err := tier.New(local, tier.Options{Dir: filepath.Join(dir, "tier"), Budget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	tiered, err := tr.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer tiered.Close()
	cl, err := peer.New(local, peer.Options{Peers: []string{"self"}, Token: "t", Budget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	peered, err := cl.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer peered.Close()

	type want struct{ drop, fd, ring bool }
	file0 := want{drop: true, fd: true, ring: true}
	cache := want{}
	for _, c := range []struct {
		name string
		r    storage.Reader
		want want
		dev  uint64
	}{
		{"file", file, file0, dev},
		{"faulty file", &storage.Faulty{Reader: file}, file0, dev},
		// A set's file opens at its first read: no descriptor of its own
		// to give, no device before it is open.
		{"set's file", set.Object(0), want{drop: true, ring: true}, 0},
		{"faulty set's file", &storage.Faulty{Reader: set.Object(0)}, want{drop: true, ring: true}, 0},
		{"tier", tiered, cache, 0},
		{"faulty tier", &storage.Faulty{Reader: tiered}, cache, 0},
		{"peer", peered, cache, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if v := c.r.Version(); v != version {
				t.Errorf("version %q, want the file's %q", v, version)
			}
			if d := storage.DeviceOf(c.r); d != c.dev {
				t.Errorf("device %d, want %d", d, c.dev)
			}
			if d, ok := storage.As[storage.Dropper](c.r); ok != c.want.drop {
				t.Errorf("Drop found: %v, want %v", ok, c.want.drop)
			} else if ok {
				if err := d.Drop(0, 1<<20); err != nil {
					t.Errorf("Drop: %v", err)
				}
			}
			if fd, ok := storage.As[storage.Descriptor](c.r); ok != c.want.fd {
				t.Errorf("descriptor found: %v, want %v", ok, c.want.fd)
			} else if ok && fd.Fd() != file.Fd() {
				t.Errorf("descriptor %d, want the file's %d", fd.Fd(), file.Fd())
			}
			if f, ok := storage.RingFile(c.r); ok != c.want.ring {
				t.Errorf("io_uring path: %v, want %v", ok, c.want.ring)
			} else if ok && (f.Name() != path || f.Version() != version) {
				t.Errorf("io_uring path through %s (%s), want %s", f.Name(), f.Version(), path)
			}
			if h := storage.HintsOf(c.r); h.BlockSize <= 0 || h.Depth <= 0 || h.Align != 1 {
				t.Errorf("hints %+v", h)
			}

			e := storage.NewEngine(storage.EngineOptions{})
			defer e.Close()
			got := make([]byte, len(data))
			if err := e.Read(ctx, c.r, got, 0); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read through an engine: %v, or other bytes", err)
			}
			// A fault put in front of the wrapper reaches the engine's
			// read of it, and a short first read is continued.
			eio := errors.New("injected")
			bad := &storage.Faulty{Reader: c.r, Inject: func(off int64, n int) error {
				if off == 4096 {
					return eio
				}
				return nil
			}, Short: func(off int64, n int) int { return n / 3 }}
			if err := e.Read(ctx, bad, make([]byte, 100), 4096); !errors.Is(err, eio) {
				t.Errorf("an injected fault: %v", err)
			}
			p := make([]byte, 1<<20)
			if err := e.Read(ctx, bad, p, 8192); err != nil || !bytes.Equal(p, data[8192:8192+len(p)]) {
				t.Errorf("a short read continued: %v, or other bytes", err)
			}
			if bad.Reads.Load() != 1 {
				t.Errorf("the faulty reader counted %d reads served, want 1", bad.Reads.Load())
			}
		})
	}
}
