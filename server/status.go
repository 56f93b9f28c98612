package server

import (
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// track counts a job as live, for status.
func (s *Server) track(j *handle) {
	s.statMu.Lock()
	s.live[j] = true
	s.statMu.Unlock()
}

// retire moves a closed job's counts into the daemon's totals.
func (s *Server) retire(j *handle) {
	st := j.j.Stats()
	s.statMu.Lock()
	if s.live[j] {
		delete(s.live, j)
		s.doneRead += st.Bytes + st.Staged
		s.doneServ += j.bytes.Load()
	}
	s.statMu.Unlock()
}

// traffic is the bytes read from storage and served to jobs so far.
func (s *Server) traffic() (read, served int64) {
	s.statMu.Lock()
	defer s.statMu.Unlock()
	read, served = s.doneRead, s.doneServ
	for j := range s.live {
		st := j.j.Stats()
		read += st.Bytes + st.Staged
		served += j.bytes.Load()
	}
	return read, served
}

// status describes the daemon for `riffle status`.
func (s *Server) status() *wire.Status {
	st := s.env.Cache().Stats()
	read, served := s.traffic()
	out := &wire.Status{
		Clients: int(s.clients.Load()),
		Cache: wire.CacheStatus{Bytes: st.Bytes, Budget: st.Budget, Items: st.Items, Hits: st.Hits, Misses: st.Misses,
			Evictions: st.Evictions},
		Groups:      s.groupStatus(),
		ReadBytes:   read,
		ServedBytes: served,
	}
	stk := s.stack.Stats()
	if rs := stk.Remote; rs != nil {
		out.Remote = &wire.RemoteStatus{Gets: rs.Gets, Bytes: rs.Bytes, Retries: rs.Retries}
	}
	if ts := stk.Disk; ts != nil {
		out.Disk = &wire.DiskStatus{Bytes: ts.Bytes, Blocks: ts.Blocks, Hits: ts.Hits, Misses: ts.Misses}
	}
	out.Memory = s.budget.status()
	s.memoryUse(out.Memory)
	if cs := stk.Peers; cs != nil {
		out.Peers = &wire.PeersStatus{Node: s.Node, Nodes: len(s.Peers), Local: cs.Local, FromPeers: cs.FromPeers,
			Served: cs.Served, Fallbacks: cs.Fallbacks, Fetched: cs.Fetched, Bytes: cs.Bytes}
	}
	// Jobs outside any group are listed as groups of one.
	s.statMu.Lock()
	for h := range s.live {
		if st := h.j.Status(h.records.Load()); !st.Shared {
			out.Groups = append(out.Groups, wire.GroupStatus{Source: st.Source, Records: st.Records, Jobs: []wire.JobStatus{h.status(st)},
				PagesKept: st.PagesKept, PagesDropped: st.PagesDropped, RecordsPassed: st.RecordsPassed})
		}
	}
	s.statMu.Unlock()
	return out
}

// groupStatus lists the share groups and their jobs.
func (s *Server) groupStatus() []wire.GroupStatus {
	handles := map[*job.Job]*handle{}
	s.statMu.Lock()
	for h := range s.live {
		handles[h.j] = h
	}
	s.statMu.Unlock()
	var out []wire.GroupStatus
	for _, g := range s.env.Groups() {
		gs := wire.GroupStatus{Source: g.Source, Records: g.Records, Shared: g.Stats.Shared, Rounds: g.Stats.Rounds,
			Given: g.Stats.Given, Saved: g.Stats.Saved, PagesKept: g.Stats.PagesKept, PagesDropped: g.Stats.PagesDropped}
		for _, j := range g.Jobs {
			if h, ok := handles[j]; ok { // open, not a check
				gs.Jobs = append(gs.Jobs, h.status(j.Status(h.records.Load())))
			}
		}
		out = append(out, gs)
	}
	return out
}

// status is the job's line in status: what the job says of itself, and
// the memory its handle reserved.
func (h *handle) status(st job.Status) wire.JobStatus {
	js := wire.JobStatus{ID: fmt.Sprint(st.ID), Subset: st.Subset, Epoch: st.Epoch, Position: st.Position,
		SamplesSec: st.SamplesSec, Transform: st.Transform, Auto: st.Auto, Direct: st.Direct}
	if h.hold != nil {
		js.Memory = h.s.budget.sizeOf(h.hold)
		if js.Memory < h.hold.want {
			js.MemoryFull = h.hold.want
		}
	}
	return js
}

// memoryUse fills in what the daemon's memory holds: the Go runtime's,
// the decodes', and what the kernel counts resident, split by kind.
func (s *Server) memoryUse(m *wire.MemoryStatus) {
	ms := []metrics.Sample{{Name: "/gc/gomemlimit:bytes"}, {Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(ms)
	v := make([]int64, len(ms))
	for i, x := range ms {
		if x.Value.Kind() == metrics.KindUint64 {
			v[i] = int64(min(x.Value.Uint64(), 1<<63-1))
		}
	}
	m.GoLimit, m.GoHeap, m.GoRuntime = v[0], v[1], v[2]-v[3]
	d := s.env.Decodes()
	m.Decoding, m.DecodePeak = d.Used, d.Peak
	r := resident()
	m.RSS, m.RSSPeak, m.RSSAnon, m.RSSFile, m.RSSShmem = r["VmRSS"], r["VmHWM"], r["RssAnon"], r["RssFile"], r["RssShmem"]
}

// resident reads the kernel's counts of the process's memory from
// /proc/self/status, in bytes: VmRSS, VmHWM, RssAnon, RssFile, RssShmem.
func resident() map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !(strings.HasPrefix(k, "Rss") || k == "VmRSS" || k == "VmHWM") {
			continue
		}
		if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
			out[k] = kb << 10
		}
	}
	return out
}
