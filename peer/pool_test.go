package peer

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// A pooled connection idle for half of IdleTimeout is closed, not reused:
// the next request dials afresh.
func TestIdlePooledConnectionDropped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	closed := make(chan struct{}, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				if _, err := ReadHello(r); err != nil {
					return
				}
				c.Write(AppendAnswer(nil, 0, StatusOK, nil))
				for {
					q, err := ReadRequest(r)
					if err != nil {
						if err == io.EOF {
							closed <- struct{}{}
						}
						return
					}
					c.Write(AppendAnswer(nil, q.Tag, StatusOK, make([]byte, q.Length)))
				}
			}()
		}
	}()
	p := &remote{addr: ln.Addr().String(), token: "t", timeout: 5 * time.Second, pool: make(chan *Conn, 4)}
	defer p.close()
	ctx := context.Background()
	if _, err := p.get(ctx, "s3://b/o", "v", 0, 0, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := p.get(ctx, "s3://b/o", "v", 0, 0, 10); err != nil || accepted.Load() != 1 {
		t.Fatalf("a fresh pooled connection was not reused: %v, %d dialled", err, accepted.Load())
	}
	pc := <-p.pool
	pc.idle = time.Now().Add(-IdleTimeout / 2)
	p.pool <- pc
	if _, err := p.get(ctx, "s3://b/o", "v", 0, 0, 10); err != nil {
		t.Fatal(err)
	}
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections dialled, want a new one for the idle one", n)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection was not closed")
	}
	if n := p.open.Load(); n != 1 {
		t.Fatalf("%d connections counted open, want 1", n)
	}
}
