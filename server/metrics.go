package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// collector reads the daemon's counts when Prometheus scrapes: nothing is
// counted twice and the hot path does no metrics work. Names follow
// Prometheus's conventions: a unit suffix, _total for counters.
//
// Anyone on the machine can reach a loopback port, and a dataset's path
// can name a file in a directory they may not list; so the source label
// is a short keyed hash of the paths (the same source, the same label,
// across restarts), and only a scrape that presents the daemon's token
// (Authorization: Bearer TOKEN) sees the paths themselves.
type collector struct {
	s    *Server
	full bool // paths as they are, for a scrape with the token
}

var (
	descReadBytes   = prometheus.NewDesc("riffle_read_bytes_total", "Bytes read from storage for jobs.", nil, nil)
	descServedBytes = prometheus.NewDesc("riffle_served_bytes_total", "Bytes of batches handed to jobs.", nil, nil)
	descJobs        = prometheus.NewDesc("riffle_jobs", "Jobs open.", nil, nil)
	descClients     = prometheus.NewDesc("riffle_clients", "Client connections.", nil, nil)
	descCacheBytes  = prometheus.NewDesc("riffle_cache_bytes", "Bytes held by the record cache.", nil, nil)
	descCacheBudget = prometheus.NewDesc("riffle_cache_budget_bytes", "The record cache's budget.", nil, nil)
	descCacheItems  = prometheus.NewDesc("riffle_cache_items", "Items held by the record cache.", nil, nil)
	descCacheHits   = prometheus.NewDesc("riffle_cache_hits_total", "Lookups that found a record in the cache.", nil, nil)
	descCacheMisses = prometheus.NewDesc("riffle_cache_misses_total", "Lookups that did not.", nil, nil)
	descCacheEvict  = prometheus.NewDesc("riffle_cache_evictions_total", "Records evicted for room.", nil, nil)
	descGroupJobs   = prometheus.NewDesc("riffle_group_jobs", "Jobs sampling dependently in each group (source: a hash of its paths, the paths with the token).", []string{"source"}, nil)
	descShared      = prometheus.NewDesc("riffle_group_shared_records_total", "Records one read served to several jobs (source: a hash of its paths, the paths with the token).", []string{"source"}, nil)
	descJobSamples  = prometheus.NewDesc("riffle_job_samples_per_second", "Each job's records per second since it opened.", []string{"job"}, nil)
	descMemLimit    = prometheus.NewDesc("riffle_memory_limit_bytes", "The memory the daemon may use: its cgroup's limit, or the machine's.", nil, nil)
	descMemJobs     = prometheus.NewDesc("riffle_memory_jobs_budget_bytes", "The part of the limit for jobs' shared memory.", nil, nil)
	descMemHeld     = prometheus.NewDesc("riffle_memory_held_bytes", "Jobs' shared memory reserved from the budget.", nil, nil)
	descMemHolders  = prometheus.NewDesc("riffle_memory_holders", "Jobs holding shared memory of the budget.", nil, nil)
	descMemWaiting  = prometheus.NewDesc("riffle_memory_waiting_opens", "Opens waiting for room in the budget.", nil, nil)
	descMemRefused  = prometheus.NewDesc("riffle_memory_refused_total", "Opens refused for memory.", nil, nil)
	descGoLimit     = prometheus.NewDesc("riffle_go_memory_limit_bytes", "The Go runtime's memory limit, which follows the jobs' reservations.", nil, nil)
	descMemBent     = prometheus.NewDesc("riffle_memory_bent_jobs", "Jobs holding less than their full shared memory while memory is short.", nil, nil)
	descMemShrunk   = prometheus.NewDesc("riffle_memory_shrunk_total", "Times a job was told to give shared memory back for an open.", nil, nil)
	descMemGrown    = prometheus.NewDesc("riffle_memory_grown_total", "Times a job was given more shared memory as memory freed.", nil, nil)
	descDecode      = prometheus.NewDesc("riffle_memory_decode_budget_bytes", "The most memory image decodes take at once.", nil, nil)
	descDecoding    = prometheus.NewDesc("riffle_memory_decoding_bytes", "Memory image decodes hold now.", nil, nil)
	descGoHeap      = prometheus.NewDesc("riffle_go_heap_bytes", "The Go heap's objects, the record cache among them.", nil, nil)
	descGoRuntime   = prometheus.NewDesc("riffle_go_runtime_bytes", "Memory the Go runtime holds and has not given back to the system.", nil, nil)
	descResident    = prometheus.NewDesc("riffle_memory_resident_bytes", "Resident memory by kind, as the kernel counts it (/proc/self/status): "+
		"anon (the Go runtime, libjpeg), shmem (the jobs' arenas), file (mapped files: the binary, and data files' cached pages, which are the page cache's).", []string{"kind"}, nil)
	descResidentMax = prometheus.NewDesc("riffle_memory_resident_peak_bytes", "The most resident memory so far (VmHWM), mapped files' cached pages included.", nil, nil)
	descJobMemory   = prometheus.NewDesc("riffle_job_memory_bytes", "Each job's shared memory, reserved from the budget.", []string{"job"}, nil)
	descJobRL       = prometheus.NewDesc("riffle_job_auto_randomization_level", "The randomization level of the order sampler auto chose for a job.", []string{"job", "sampler"}, nil)
	descJobAutoRate = prometheus.NewDesc("riffle_job_auto_expected_samples_per_second", "The records per second the device's measured rate expects of the order sampler auto chose.", []string{"job", "sampler"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReadBytes, descServedBytes, descJobs, descClients, descCacheBytes, descCacheBudget,
		descCacheItems, descCacheHits, descCacheMisses, descCacheEvict, descGroupJobs, descShared, descJobSamples,
		descMemLimit, descMemJobs, descMemHeld, descMemHolders, descMemWaiting, descMemRefused, descGoLimit, descJobMemory,
		descMemBent, descMemShrunk, descMemGrown, descDecode, descDecoding, descGoHeap, descGoRuntime, descResident, descResidentMax,
		descJobRL, descJobAutoRate} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.status()
	m := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	m(descReadBytes, prometheus.CounterValue, float64(st.ReadBytes))
	m(descServedBytes, prometheus.CounterValue, float64(st.ServedBytes))
	m(descJobs, prometheus.GaugeValue, float64(c.s.jobs.Load()))
	m(descClients, prometheus.GaugeValue, float64(st.Clients))
	m(descCacheBytes, prometheus.GaugeValue, float64(st.Cache.Bytes))
	m(descCacheBudget, prometheus.GaugeValue, float64(st.Cache.Budget))
	m(descCacheItems, prometheus.GaugeValue, float64(st.Cache.Items))
	m(descCacheHits, prometheus.CounterValue, float64(st.Cache.Hits))
	m(descCacheMisses, prometheus.CounterValue, float64(st.Cache.Misses))
	m(descCacheEvict, prometheus.CounterValue, float64(st.Cache.Evictions))
	if mem := st.Memory; mem != nil {
		m(descMemLimit, prometheus.GaugeValue, float64(mem.Limit))
		m(descMemJobs, prometheus.GaugeValue, float64(mem.Jobs))
		m(descMemHeld, prometheus.GaugeValue, float64(mem.Held))
		m(descMemHolders, prometheus.GaugeValue, float64(mem.Holders))
		m(descMemWaiting, prometheus.GaugeValue, float64(len(mem.Waiting)))
		m(descMemRefused, prometheus.CounterValue, float64(mem.Refused))
		m(descGoLimit, prometheus.GaugeValue, float64(mem.GoLimit))
		m(descMemBent, prometheus.GaugeValue, float64(mem.Bent))
		m(descMemShrunk, prometheus.CounterValue, float64(mem.Shrunk))
		m(descMemGrown, prometheus.CounterValue, float64(mem.Grown))
		m(descDecode, prometheus.GaugeValue, float64(mem.Decode))
		m(descDecoding, prometheus.GaugeValue, float64(mem.Decoding))
		m(descGoHeap, prometheus.GaugeValue, float64(mem.GoHeap))
		m(descGoRuntime, prometheus.GaugeValue, float64(mem.GoRuntime))
		m(descResident, prometheus.GaugeValue, float64(mem.RSSAnon), "anon")
		m(descResident, prometheus.GaugeValue, float64(mem.RSSShmem), "shmem")
		m(descResident, prometheus.GaugeValue, float64(mem.RSSFile), "file")
		m(descResidentMax, prometheus.GaugeValue, float64(mem.RSSPeak))
	}
	for _, g := range st.Groups {
		src := g.Source
		if !c.full {
			src = c.s.hashPath(src)
		}
		m(descGroupJobs, prometheus.GaugeValue, float64(len(g.Jobs)), src)
		m(descShared, prometheus.CounterValue, float64(g.Shared), src)
		for _, j := range g.Jobs {
			m(descJobSamples, prometheus.GaugeValue, j.SamplesSec, j.ID)
			if a := j.Auto; a != nil {
				m(descJobRL, prometheus.GaugeValue, a.RL, j.ID, a.Sampler)
				m(descJobAutoRate, prometheus.GaugeValue, a.Rate, j.ID, a.Sampler)
			}
			m(descJobMemory, prometheus.GaugeValue, float64(j.Memory), j.ID)
		}
	}
}

// hashPath is a source's label without a token: 12 hex digits of an HMAC
// of it. Keyed, so that a user who guesses a path cannot confirm it by
// hashing it; the key is kept in the socket's private directory, so the
// label stays the same across restarts.
func (s *Server) hashPath(p string) string {
	h := hmac.New(sha256.New, s.metricsKey)
	h.Write([]byte(p))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// loadMetricsKey reads the key of the paths' hashes, making it the first
// time, next to the socket (in its private directory), mode 0600.
func (s *Server) loadMetricsKey() error {
	path := s.socket + ".metrics-key"
	b, err := os.ReadFile(path)
	if k := strings.TrimSpace(string(b)); err == nil && len(k) >= 32 {
		s.metricsKey = []byte(k)
		return nil
	}
	k, err := newToken()
	if err != nil {
		return err
	}
	if err := writeToken(path, k); err != nil {
		return err
	}
	s.metricsKey = []byte(k)
	return nil
}

// listenMetrics listens on the metrics address (loopback unless an
// address is named).
func (s *Server) listenMetrics() (net.Listener, error) {
	if err := s.loadMetricsKey(); err != nil {
		return nil, fmt.Errorf("metrics: the key of its hashes: %w", err)
	}
	host, port, err := net.SplitHostPort(s.Metrics)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", s.Metrics, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	s.metricsAddr = l.Addr().String()
	return l, nil
}

// serveMetrics serves /metrics on l until ctx ends: paths hashed, or as
// they are to a request with the token. A wrong token is refused (401)
// and slowed as a failed hello is. Without a token (no TCP, no --token)
// the paths are never served over HTTP; riffle status, over the socket,
// shows them.
func (s *Server) serveMetrics(ctx context.Context, l net.Listener) error {
	handler := func(full bool) http.Handler {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collector{s: s, full: full})
		return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	hashed, full := handler(false), handler(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if all, ok := s.showPaths(w, r); !ok {
			return
		} else if all {
			full.ServeHTTP(w, r)
			return
		}
		hashed.ServeHTTP(w, r)
	})
	s.viewRoutes(mux)
	// Anyone on the machine may connect, with no token: each connection
	// is bounded in time, and the connections in number (capped), so
	// that idle ones cannot take the descriptors the daemon's clients need.
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10}
	l = &capped{Listener: l, slots: make(chan struct{}, maxMetricsConns)}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	slog.Info("metrics", "addr", s.metricsAddr)
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err // ends the daemon's group, and so ctx and the goroutine
	}
	<-shut
	return nil
}

// maxMetricsConns bounds the metrics listener's connections: a scraper
// and a few pages of the live view need a handful.
const maxMetricsConns = 64

// capped is a listener that serves at most cap(slots) connections at
// once: one more is closed as soon as it is accepted, and so holds no
// descriptor, where netutil.LimitListener would leave it waiting in the
// listen queue.
type capped struct {
	net.Listener
	slots chan struct{}
}

func (l *capped) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
		default:
			// Debug, not Warn: a flood would fill the log.
			slog.Debug("too many metrics connections; refusing one", "max", cap(l.slots))
			c.Close()
		}
	}
}

// slotConn gives its place back when it closes.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}
