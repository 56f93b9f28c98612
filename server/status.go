package server

import "github.com/riffle-ml/riffle/wire"

// track counts a job as live, for status.
func (s *Server) track(j *job) {
	s.statMu.Lock()
	s.live[j] = true
	s.statMu.Unlock()
}

// retire moves a closed job's counts into the daemon's totals.
func (s *Server) retire(j *job) {
	st := j.l.Stats()
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
		st := j.l.Stats()
		read += st.Bytes + st.Staged
		served += j.bytes.Load()
	}
	return read, served
}

// status describes the daemon for `riffle status`.
func (s *Server) status() *wire.Status {
	st := s.cache.Stats()
	read, served := s.traffic()
	out := &wire.Status{
		Clients: int(s.clients.Load()),
		Cache: wire.CacheStatus{Bytes: st.Bytes, Budget: st.Budget, Items: st.Items, Hits: st.Hits, Misses: st.Misses,
			Evictions: st.Evictions},
		Groups:      s.groups.status(),
		ReadBytes:   read,
		ServedBytes: served,
	}
	if s.store.RemoteMade() {
		if r, err := s.store.Remote(); err == nil {
			rs := r.Stats()
			out.Remote = &wire.RemoteStatus{Gets: rs.Gets, Bytes: rs.Bytes, Retries: rs.Retries}
		}
	}
	if t := s.tier.Load(); t != nil {
		ts := t.Stats()
		out.Disk = &wire.DiskStatus{Bytes: ts.Bytes, Blocks: ts.Blocks, Hits: ts.Hits, Misses: ts.Misses}
	}
	if c := s.cluster.Load(); c != nil {
		cs := c.Stats()
		out.Peers = &wire.PeersStatus{Node: s.Node, Nodes: len(s.Peers), Local: cs.Local, FromPeers: cs.FromPeers,
			Served: cs.Served, Fallbacks: cs.Fallbacks, Fetched: cs.Fetched, Bytes: cs.Bytes}
	}
	// Jobs outside any group are listed as groups of one.
	s.statMu.Lock()
	for j := range s.live {
		if j.member == nil {
			out.Groups = append(out.Groups, wire.GroupStatus{Source: j.ds.desc(), Records: j.ds.ds.Len(), Jobs: []wire.JobStatus{j.status()}})
		}
	}
	s.statMu.Unlock()
	return out
}
