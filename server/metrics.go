package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// collector reads the daemon's counts when Prometheus scrapes: nothing is
// counted twice and the hot path does no metrics work. Names follow
// Prometheus's conventions: a unit suffix, _total for counters.
type collector struct{ s *Server }

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
	descGroupJobs   = prometheus.NewDesc("riffle_group_jobs", "Jobs sampling dependently in each group.", []string{"source"}, nil)
	descShared      = prometheus.NewDesc("riffle_group_shared_records_total", "Records one read served to several jobs.", []string{"source"}, nil)
	descJobSamples  = prometheus.NewDesc("riffle_job_samples_per_second", "Each job's records per second since it opened.", []string{"job"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReadBytes, descServedBytes, descJobs, descClients, descCacheBytes, descCacheBudget,
		descCacheItems, descCacheHits, descCacheMisses, descCacheEvict, descGroupJobs, descShared, descJobSamples} {
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
	for _, g := range st.Groups {
		m(descGroupJobs, prometheus.GaugeValue, float64(len(g.Jobs)), g.Source)
		m(descShared, prometheus.CounterValue, float64(g.Shared), g.Source)
		for _, j := range g.Jobs {
			m(descJobSamples, prometheus.GaugeValue, j.SamplesSec, j.ID)
		}
	}
}

// serveMetrics serves /metrics on addr (loopback unless an address is
// named) until ctx ends.
func (s *Server) serveMetrics(ctx context.Context, addr string) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{s})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		host = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return err
	}
	s.metricsAddr = l.Addr().String()
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	slog.Info("metrics", "addr", s.metricsAddr)
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
