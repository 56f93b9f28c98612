package server

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// viewRing holds the live view's recent samples of the daemon.
type viewRing struct {
	mu sync.Mutex
}

// sampleView samples the daemon for the live view every viewEvery until
// ctx ends.
func (s *Server) sampleView(ctx context.Context) error {
	every := s.viewEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// viewRoutes adds the live view to the metrics listener's mux.
func (s *Server) viewRoutes(mux *http.ServeMux) {
	mux.HandleFunc("/view", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.showPaths(w, r); !ok {
			return
		}
		http.Error(w, "the live view is not built yet", http.StatusNotFound)
	})
}
