package peer

import (
	"bufio"
	"context"
	"errors"
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

// The breaker's backoff grows with each time it opens, not with each
// request that fails: the requests in flight to a peer when it fails (a
// pool's worth) all fail, and a daemon restarted in a second must not be
// shunned for the 30s the sixteenth doubling reaches.
func TestBreakerBacksOffPerOpening(t *testing.T) {
	p := &remote{addr: "127.0.0.1:1", token: "t", timeout: time.Second, pool: make(chan *Conn, 16)}
	fail := errors.New("connection refused")
	start := time.Now()
	for range 16 {
		p.trip(fail, start) // every request in flight, all sent before it opened
	}
	if p.backoff != 500*time.Millisecond {
		t.Fatalf("16 requests in flight failed at once: the breaker stays open %v, want 500ms", p.backoff)
	}
	// A request sent after it opened (its probe, once it closed) that
	// fails opens it again, for twice as long.
	p.mu.Lock()
	p.downTil = time.Now()
	p.mu.Unlock()
	p.trip(fail, time.Now())
	if p.backoff != time.Second {
		t.Fatalf("a failed probe opened the breaker for %v, want 1s", p.backoff)
	}
}

// Only a request sent after the breaker last opened says the peer is
// well again: one that was in flight when it opened and came back in time
// (a slow peer answers some requests within the timeout and not others)
// leaves the backoff to grow, or a slow peer is asked again every half
// second, each time costing the reads in flight a timeout.
func TestBreakerForgetsOnlyForLaterRequests(t *testing.T) {
	p := &remote{addr: "127.0.0.1:1", token: "t", timeout: time.Second, pool: make(chan *Conn, 16)}
	fail := errors.New("i/o timeout")
	for k := range 3 {
		sent := time.Now()
		p.trip(fail, sent)
		p.healthy(sent) // in flight when it opened, answered in time
		if want := 500 * time.Millisecond << k; p.backoff != want {
			t.Fatalf("opening %d: backoff %v after a request in flight came back, want %v", k+1, p.backoff, want)
		}
		p.mu.Lock()
		p.downTil = time.Now() // it closes again
		p.mu.Unlock()
	}
	p.healthy(time.Now())
	if p.backoff != 0 {
		t.Fatalf("a request sent after the breaker closed came back: backoff %v, want 0", p.backoff)
	}
}
