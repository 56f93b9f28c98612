// Package stack builds the store stack a daemon reads through from one
// Settings value, as pebble's objstorageprovider.Open builds its tiers
// from its Settings: local files (confined to roots), the S3 store
// s3:// names go to, and in front of that store the nodes' memory
// (storage/peer, DeepIO's distributed memory tier, deepio.txt §III-B)
// and this node's disk (storage/tier). A read of an s3:// object goes
// disk tier → nodes' memory → object store, each tier reading the next
// for what it lacks.
//
// Open checks the settings at once, so that a daemon given a peer list
// it cannot join or a directory it cannot trust stops at start, saying
// which flag of riffle serve to fix, rather than failing a job at its
// first read. The object store and its tiers are made at the first
// s3:// name (a daemon of local files never reads the AWS configuration),
// except with peers, which ask this node for blocks before it reads any.
//
// Nothing above the stack wires tiers by hand: the daemon passes its
// flags here, hands Store to its jobs and reads Stats for its status.
package stack

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
	"github.com/riffle-ml/riffle/storage/tier"
)

// Settings say what the stack holds. The zero value is local files
// anywhere the process may read, and an S3 store configured from the AWS
// environment at the first s3:// name, with no tier in front of it.
type Settings struct {
	// Roots, if set, are the only directories local files are read from:
	// every file is opened through them (storage.Local), so no symlink
	// leads out.
	Roots []string
	// S3 configures the object store s3:// names are read from.
	S3 storage.S3Options
	// TierDir, if set, keeps blocks of s3:// objects on local disk, up to
	// TierBytes (at least, and by default, 64 MiB), evicting the block
	// next wanted farthest in the future (riffle serve --cache-dir,
	// --cache-dir-bytes). It must be private to the daemon's user
	// (internal/privdir), and is made if missing.
	TierDir   string
	TierBytes int64
	// Peers, if set, are the TCP addresses of every node's daemon, the
	// same list in the same order on every node: their memory together
	// holds the blocks of s3:// objects, each block in its owner's (riffle
	// serve --peers). Node is this one's index in the list (--node),
	// Token the one every node shares (--token), PeerBytes the memory it
	// gives the blocks it owns (--peer-bytes: at least, and by default, 64
	// MiB) and PeerTimeout bounds one request to a peer before the
	// object store is read instead (--peer-timeout; default
	// peer.Options').
	Peers       []string
	Node        int
	Token       string
	PeerBytes   int64
	PeerTimeout time.Duration
}

// minTierBytes is the least (and default) budget of either tier.
const minTierBytes = 1 << 26

// Stack is the store stack: Store is what jobs read through.
type Stack struct {
	settings Settings
	store    *storage.Router
	tier     atomic.Pointer[tier.Tier]
	cluster  atomic.Pointer[peer.Cluster]
}

// Open checks s and builds the stack. Close it when no job reads it.
func Open(s Settings) (*Stack, error) {
	local, err := storage.NewLocal(false, s.Roots)
	if err != nil {
		return nil, err
	}
	st := &Stack{settings: s}
	if err := st.check(); err != nil {
		local.Close()
		return nil, err
	}
	var made error // what the tiers' making found, for a peered Open
	st.store = storage.NewRouter(local, s.S3, func(remote storage.Store) storage.Store {
		var err error
		remote, err = st.front(remote)
		made = err
		return remote
	})
	if len(s.Peers) > 0 {
		// Peers ask for blocks before this node reads any: the cluster
		// tier must be there from the start.
		if _, err := st.store.Remote(); err != nil {
			st.Close()
			return nil, fmt.Errorf("--peers: the object store: %w", err)
		}
		if made != nil {
			st.Close()
			return nil, made
		}
	}
	return st, nil
}

// check refuses, before anything is made, settings the stack could not
// honour: a peer list without a token or without this node, a tier
// directory that is not private to the daemon's user.
func (st *Stack) check() error {
	s := st.settings
	if len(s.Peers) > 0 && s.Token == "" {
		return errors.New("--peers needs --token (or $RIFFLE_TOKEN): every node's daemon must share one")
	}
	if len(s.Peers) > 0 && (s.Node < 0 || s.Node >= len(s.Peers)) {
		return fmt.Errorf("node %d is not in a peer list of %d", s.Node, len(s.Peers))
	}
	if s.TierDir != "" {
		d, err := privdir.Open(s.TierDir)
		if err != nil {
			return fmt.Errorf("the disk tier's directory (--cache-dir): %w", err)
		}
		d.Close()
	}
	return nil
}

// front puts the tiers in front of the object store, once, when it is
// made: the nodes' memory, then this node's disk. A tier that cannot be
// made is left out, with a warning, and its error returned.
func (st *Stack) front(remote storage.Store) (storage.Store, error) {
	s := st.settings
	var failed error
	if len(s.Peers) > 0 {
		c, err := peer.New(remote, peer.Options{Peers: s.Peers, Self: s.Node, Token: s.Token,
			Budget: max(s.PeerBytes, minTierBytes), Timeout: s.PeerTimeout})
		if err != nil {
			failed = fmt.Errorf("the cluster's memory tier (--peers): %w", err)
			slog.Warn("no cluster tier", "err", err)
		} else {
			st.cluster.Store(c)
			remote = c
		}
	}
	if s.TierDir != "" {
		t, err := tier.New(remote, tier.Options{Dir: s.TierDir, Budget: max(s.TierBytes, minTierBytes)})
		if err != nil {
			failed = fmt.Errorf("the disk tier (--cache-dir): %w", err)
			slog.Warn("no disk tier", "dir", s.TierDir, "err", err)
		} else {
			st.tier.Store(t)
			remote = t
		}
	}
	return remote, failed
}

// Store is what jobs read through: local files, and s3:// objects through
// the tiers.
func (st *Stack) Store() *storage.Router { return st.store }

// Tier is the disk tier, nil while there is none (no TierDir, or no
// s3:// name read yet).
func (st *Stack) Tier() *tier.Tier { return st.tier.Load() }

// Cluster is the nodes' memory tier, nil without peers.
func (st *Stack) Cluster() *peer.Cluster { return st.cluster.Load() }

// Stats are the counts of each part of the stack that has been made; nil
// for a part that has not.
type Stats struct {
	Remote *storage.S3Stats // the object store's GETs
	Disk   *tier.Stats
	Peers  *peer.Stats
}

// Stats reads the stack's counts; safe at any time, from any goroutine.
// It makes nothing.
func (st *Stack) Stats() Stats {
	var out Stats
	if st.store.RemoteMade() {
		if r, err := st.store.Remote(); err == nil {
			rs := r.Stats()
			out.Remote = &rs
		}
	}
	if t := st.Tier(); t != nil {
		ts := t.Stats()
		out.Disk = &ts
	}
	if c := st.Cluster(); c != nil {
		cs := c.Stats()
		out.Peers = &cs
	}
	return out
}

// Close closes the local store, then the connections to peers and the
// objects opened for them.
func (st *Stack) Close() error {
	err := st.store.Close()
	if c := st.Cluster(); c != nil {
		c.Close()
	}
	return err
}
