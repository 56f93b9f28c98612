package sampler

import "errors"

// Samplers that shuffle in memory: cheaper orders for storage without fast
// random reads, and the structure OneAccess builds on (oneaccess.txt §3):
// storage sees only forward reads, in large coalesced runs, and all random
// access happens in memory, where batches are drawn from what was loaded.
//
// Such a sampler is Staged: an epoch is a sequence of stages, each a set
// of ids in ascending order that the loader reads ahead into memory. The
// order itself is still a Sampler's: positions map to ids, and a position's
// id always belongs to a stage at or before StageOf(position).
type Staged interface {
	Sampler
	// Stage returns the ids stage s of an epoch loads, ascending, or ok
	// false when the epoch has no stage s.
	Stage(epoch, s int) (ids []int, ok bool)
	// StageOf returns the last stage that must be loaded before the id at
	// position pos is used.
	StageOf(epoch, pos int) int
}

// Stateful is implemented by samplers whose order is a stream that is no
// cheap function of position (a group of jobs
// sampling dependently). Their Fill must be called at increasing
// positions. Mark, called after a Fill, returns a token for the state at
// the position after it, cheaply; Save encodes a token for a checkpoint;
// Restore continues from what Save returned, so that a resumed loader
// delivers exactly the ids the uninterrupted one would have.
type Stateful interface {
	Sampler
	Mark() any
	Save(mark any) ([]byte, error)
	Restore(state []byte) (epoch, pos int, err error)
}

// IsStream reports whether s's order is a stream whose place needs a saved
// state to resume (a Stateful sampler that is not a pure function of
// position underneath).
func IsStream(s Sampler) bool {
	switch s := s.(type) {
	case *RankPart:
		return IsStream(s.Base)
	case interface{ Stream() bool }:
		return s.Stream()
	}
	return false
}

// ErrState says a saved sampler state does not fit this sampler.
var ErrState = errors.New("sampler state does not match the sampler")

// MaxEpoch bounds the epochs a job counts (a spec's, a saved state's):
// 2^40, far past any run, and far from an int's overflow in the
// arithmetic of epochs and positions.
const MaxEpoch = 1 << 40
