package peer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// servePeers serves every connection to a loopback listener with
// c.ServeConn and o, until the test ends; ended receives each
// connection's end.
func servePeers(t *testing.T, c *Cluster, o ServeOptions) (addr string, ended chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended = make(chan error, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []chan struct{}
		defer func() {
			for _, d := range conns {
				<-d
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			d := make(chan struct{})
			conns = append(conns, d)
			go func() {
				defer close(d)
				defer conn.Close()
				ended <- c.ServeConn(ctx, conn, o)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
	})
	return ln.Addr().String(), ended
}

func dialT(t *testing.T, addr, token string) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Dial(ctx, addr, token)
}

// A peer holding the token gets the bytes it asks for; absurd requests,
// another version and a panic below Serve are answered with errors, and
// the connection serves on.
func TestServeConnAnswers(t *testing.T) {
	// Checked last, once the listener and its connections are gone.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	c, st := fuzzCluster(t, 0)
	addr, _ := servePeers(t, c, ServeOptions{})
	pc, err := dialT(t, addr, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx := context.Background()
	get := func(q Request) ([]byte, error) {
		q.Object = fuzzObject
		if q.Version == "" {
			q.Version = "v1"
		}
		return pc.Get(ctx, q)
	}
	if b, err := get(Request{Block: 1, Offset: 10, Length: 100}); err != nil || !bytes.Equal(b, st.data[4096+10:4096+110]) {
		t.Fatalf("block 1: %v", err)
	}
	var ae *AnswerError
	for _, q := range []Request{{Block: 1 << 62, Length: 1}, {Block: 0, Offset: 1<<63 - 10, Length: 100}, {Block: 3, Offset: 90, Length: 20}, {Block: -1, Length: 1}} {
		if _, err := get(q); !errors.As(err, &ae) || strings.Contains(err.Error(), "internal error") {
			t.Fatalf("%+v: %v, want an answered error", q, err)
		}
	}
	if _, err := get(Request{Block: 0, Length: 1, Version: "v0"}); !IsChanged(err) {
		t.Fatalf("another version: %v", err)
	}
	st.panicAt = 2*4096 + 1
	if _, err := get(Request{Block: 2, Length: 10}); !errors.As(err, &ae) || !strings.Contains(err.Error(), "internal error") {
		t.Fatalf("a panicking read: %v", err)
	}
	st.panicAt = 0
	if b, err := get(Request{Block: 3, Length: 100}); err != nil || !bytes.Equal(b, st.data[3*4096:]) {
		t.Fatalf("the last block, after the errors: %v", err)
	}
}

// A wrong token is refused after the daemon's slowing; a full room and
// another protocol version are refused with their reasons; a request
// whose names are past their bounds ends the connection.
func TestServeConnRefuses(t *testing.T) {
	c, _ := fuzzCluster(t, 0)
	var refused atomic.Int32
	full := atomic.Bool{}
	addr, ended := servePeers(t, c, ServeOptions{
		Refused: func() { refused.Add(1) },
		Admit: func() error {
			if full.Load() {
				return errors.New("the room is full")
			}
			return nil
		}})
	if _, err := dialT(t, addr, "wrong"); err == nil || !strings.Contains(err.Error(), "wrong token") || refused.Load() != 1 {
		t.Fatalf("a wrong token: %v, %d refusals", err, refused.Load())
	}
	full.Store(true)
	if _, err := dialT(t, addr, "t"); err == nil || !strings.Contains(err.Error(), "the room is full") {
		t.Fatalf("a full room: %v", err)
	}
	full.Store(false)
	raw := func(send []byte) (Answer, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(send)
		r := bufio.NewReader(conn)
		a, err := ReadAnswer(r, 0)
		if err != nil || a.Status != StatusOK {
			return a, err
		}
		return ReadAnswer(r, 0)
	}
	hello := AppendHello(nil, "t")
	hello[len(Magic)] = 2
	if a, err := raw(hello); err != nil || a.Status != StatusError || !strings.Contains(a.Message, "version 2") {
		t.Fatalf("another version: %+v %v", a, err)
	}
	// The header alone: the daemon reads no name past its bound.
	long := (&Request{Tag: 5, Object: strings.Repeat("x", MaxObject+1)}).Append(AppendHello(nil, "t"))
	long = long[:len(AppendHello(nil, "t"))+requestHead]
	if a, err := raw(long); err != nil || a.Status != StatusError || !strings.Contains(a.Message, "object name") {
		t.Fatalf("a name past its bound: %+v %v", a, err)
	}
	for range 4 {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a refused connection was not ended")
		}
	}
}

// A peer's connection idle past IdleTimeout is ended by the serving side.
func TestServeConnIdle(t *testing.T) {
	c, _ := fuzzCluster(t, 0)
	addr, ended := servePeers(t, c, ServeOptions{IdleTimeout: 100 * time.Millisecond})
	pc, err := dialT(t, addr, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case err := <-ended:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the idle connection ended with %v, want its deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle peer's connection was kept")
	}
	if _, err := pc.Get(context.Background(), Request{Object: fuzzObject, Version: "v1", Length: 1}); err == nil {
		t.Fatal("a request on a connection the daemon closed was answered")
	}
}
