package server

import "github.com/riffle-ml/riffle/wire"

// status describes the daemon for `riffle status`.
func (s *Server) status() *wire.Status {
	st := s.cache.Stats()
	return &wire.Status{
		Clients: int(s.clients.Load()),
		Cache: wire.CacheStatus{Bytes: st.Bytes, Budget: st.Budget, Items: st.Items, Hits: st.Hits, Misses: st.Misses,
			Evictions: st.Evictions},
	}
}
