package server

import (
	"bufio"
	"net"
	"net/http"
	"testing"

	"github.com/riffle-ml/riffle/wire"
)

// Connections to the metrics port, which need no token, are capped: 300
// idle keep-alive connections each asking once get at most
// maxMetricsConns answers and the rest are closed at once; the owner's
// socket serves throughout, and once they go a scrape is answered again.
// (The port took every connection for as long as it stayed open, each a
// descriptor, until the daemon had none left for its owner.)
func TestMetricsConnectionsAreCapped(t *testing.T) {
	s := &Server{Metrics: "127.0.0.1:0"}
	cl, _ := daemon(t, s)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	answered := 0
	for range 300 {
		c, err := net.Dial("tcp", s.MetricsAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: riffle\r\n\r\n")); err != nil {
			continue // closed already
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // closed: over the cap
		}
		resp.Body.Close() // its connection stays open, idle
		if resp.StatusCode != 200 {
			t.Fatalf("a scrape: %s", resp.Status)
		}
		answered++
	}
	if answered == 0 || answered > maxMetricsConns {
		t.Fatalf("%d of 300 idle connections were answered, want 1 to %d", answered, maxMetricsConns)
	}
	if m := cl.req(t, &wire.Msg{Op: wire.OpStatus}); m.Op != wire.OpStatus {
		t.Fatalf("the owner's status beside the metrics connections: %+v", m)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	eventually(t, "a scrape after the idle connections go", func() bool {
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Get("http://" + s.MetricsAddr() + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}
