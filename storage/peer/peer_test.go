package peer_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
)

// Every node computes the same owner; owners are balanced; a node leaving
// moves only the blocks it owned, a node joining takes only its share.
func TestOwnerRendezvous(t *testing.T) {
	peers := []string{"10.0.0.1:7470", "10.0.0.2:7470", "10.0.0.3:7470", "10.0.0.4:7470"}
	const n = 40000
	count := make([]int, len(peers))
	owner := make([]int, n)
	for i := range n {
		owner[i] = peer.Owner(peers, "s3://b/data-0.bin", int64(i))
		if again := peer.Owner(peers, "s3://b/data-0.bin", int64(i)); again != owner[i] {
			t.Fatalf("block %d: owner %d then %d", i, owner[i], again)
		}
		count[owner[i]]++
	}
	for p, c := range count {
		if c < n/4*9/10 || c > n/4*11/10 {
			t.Fatalf("peer %d owns %d of %d blocks: %v", p, c, n, count)
		}
	}
	// Node 2 leaves: only its blocks move.
	left := []string{peers[0], peers[1], peers[3]}
	idx := []int{0, 1, 3}
	for i := range n {
		o := idx[peer.Owner(left, "s3://b/data-0.bin", int64(i))]
		if owner[i] != 2 && o != owner[i] {
			t.Fatalf("block %d moved from %d to %d though its owner stayed", i, owner[i], o)
		}
	}
	// A fifth node joins: it takes about a fifth, and blocks move only to it.
	joined := append(append([]string(nil), peers...), "10.0.0.5:7470")
	moved := 0
	for i := range n {
		o := peer.Owner(joined, "s3://b/data-0.bin", int64(i))
		if o != owner[i] {
			if o != 4 {
				t.Fatalf("block %d moved from %d to %d, not to the new node", i, owner[i], o)
			}
			moved++
		}
	}
	if moved < n/5*9/10 || moved > n/5*11/10 {
		t.Fatalf("%d of %d blocks moved to the new node, want about a fifth", moved, n)
	}
}

// A node whose peers are gone reads every block right from the store
// behind, and the breaker stops it waiting on a dead peer for each block.
func TestDeadPeersFallBack(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+12345)
	rand.NewChaCha8([32]byte{1}).Read(data)
	// A port nobody listens on, and one that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	asked := make(chan struct{}, 1000)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			asked <- struct{}{}
			defer conn.Close() // accepted, never answered
		}
	}()
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	// Owners hash the path, which t.TempDir makes random: name the file
	// so that this node owns some blocks and the silent peer two or more
	// (a name drawn at random misses that about once in a hundred runs).
	peers := []string{"127.0.0.1:1", deadAddr, ln.Addr().String()}
	blocks := int64(len(data)+256<<10-1) / (256 << 10)
	var path string
	for k := 0; path == ""; k++ {
		p := filepath.Join(dir, fmt.Sprintf("d%d.bin", k))
		owned := make([]int, len(peers))
		for i := range blocks {
			owned[peer.Owner(peers, p, i)]++
		}
		if owned[0] > 0 && owned[2] >= 2 {
			path = p
		}
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	local, _ := storage.NewLocal(false, nil)
	c, err := peer.New(local, peer.Options{Peers: peers, Self: 0,
		Token: "t", Budget: 64 << 20, Block: 256 << 10, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	r, err := c.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for pass := range 2 {
		got := make([]byte, len(data))
		for off := 0; off < len(data); off += 100000 {
			end := min(off+100000, len(data))
			if err := r.ReadAt(ctx, got[off:end], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("pass %d: bytes differ", pass)
		}
	}
	st := c.Stats()
	if st.Fallbacks == 0 || st.Local == 0 {
		t.Fatalf("stats %+v: want blocks both owned and fallen back", st)
	}
	// Without the breaker every read of a block the silent peer owns
	// would ask it (and wait out the timeout); with it, one ask, maybe
	// two if the breaker closed again in between.
	silent := 0
	for i := range blocks {
		if peer.Owner(peers, path, i) == 2 {
			silent++
		}
	}
	if n := len(asked); silent < 2 || n > 2 {
		t.Fatalf("the silent peer owns %d blocks and was asked %d times", silent, n)
	}
}
