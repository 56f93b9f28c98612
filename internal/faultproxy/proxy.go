// Package faultproxy is an HTTP proxy that puts faults between a client
// and a real server: added latency, 503 answers and reset connections, in
// proportions a test sets while it runs. Tests and benchmarks put it in
// front of a real S3-compatible server on loopback.
package faultproxy

import (
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards to a target, with faults.
type Proxy struct {
	URL string // where clients connect: http://127.0.0.1:port

	mu       sync.Mutex
	latency  time.Duration
	unavail  float64 // fraction of requests answered 503
	reset    float64 // fraction of connections reset mid-request
	srv      *http.Server
	ln       net.Listener
	Requests atomic.Int64
	Faults   atomic.Int64
}

// New starts a proxy to target on a loopback port.
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{URL: "http://" + ln.Addr().String(), ln: ln}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.Requests.Add(1)
		p.mu.Lock()
		lat, un, rs := p.latency, p.unavail, p.reset
		p.mu.Unlock()
		if lat > 0 {
			time.Sleep(lat)
		}
		switch f := rand.Float64(); {
		case f < un:
			p.Faults.Add(1)
			w.Header().Set("Retry-After", "0")
			http.Error(w, "<Error><Code>SlowDown</Code><Message>injected</Message></Error>", http.StatusServiceUnavailable)
			return
		case f < un+rs:
			p.Faults.Add(1)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					if tc, ok := c.(*net.TCPConn); ok {
						tc.SetLinger(0) // RST, not FIN
					}
					c.Close()
					return
				}
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go p.srv.Serve(ln)
	return p, nil
}

// Set changes the faults: latency added to every request, and the
// fractions answered 503 and reset.
func (p *Proxy) Set(latency time.Duration, unavailable, reset float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.unavail, p.reset = latency, unavailable, reset
}

// Close stops the proxy.
func (p *Proxy) Close() error { return p.srv.Close() }
