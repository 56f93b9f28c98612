package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/wire"
)

// No accept error ends the daemon: not one the kernel gives when the
// process is out of descriptors (idle connections to the metrics port,
// a job over thousands of files at a low limit), nor any other. Accept is
// retried after a pause that doubles from 5 ms to a second, as net/http's
// Server does. And since a daemon out of descriptors would leave its
// owner's next connection waiting in the listen queue for as long as
// they last, it keeps one descriptor spare (a /dev/null): given up, it
// takes that connection, whose hello is answered with why and which is
// closed, and is taken again.

// acceptPause bounds the pause between failed accepts.
const (
	acceptPauseMin = 5 * time.Millisecond
	acceptPauseMax = time.Second
)

// spareFD is the descriptor kept for telling a client the daemon has no
// more. The zero value holds none until keep.
type spareFD struct {
	mu sync.Mutex
	f  *os.File
}

// keep takes the spare descriptor if it is not held: false if the process
// has none to take.
func (sp *spareFD) keep() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.f == nil {
		sp.f, _ = os.Open(os.DevNull)
	}
	return sp.f != nil
}

// give gives the spare descriptor back to the process: false if none was
// held (another listener has it).
func (sp *spareFD) give() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.f == nil {
		return false
	}
	sp.f.Close()
	sp.f = nil
	return true
}

// outOfFDs says err is the process's, or the system's, descriptors run out.
func outOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// fdLimit is the process's limit on descriptors.
func fdLimit() uint64 {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	return lim.Cur
}

// fdAdvice says what to do about descriptors run out.
func fdAdvice() string {
	return fmt.Sprintf("the riffle daemon has run out of file descriptors (its limit is %d): raise it where the daemon starts "+
		"(ulimit -n, or LimitNOFILE= in its systemd unit), or read fewer files at once", fdLimit())
}

// refuseHello answers a client's hello with an error saying why, which
// its client raises as the connection's: a second at most, since the
// accept loop waits for it.
func refuseHello(c net.Conn, why string) {
	c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	n, err := wire.ReadLength(r, wire.MaxHelloHeader)
	if err != nil {
		return
	}
	if m, err := wire.ReadBody(r, n); err == nil {
		wire.Write(c, &wire.Msg{Op: wire.OpError, Tag: m.Tag, Kind: wire.KindInternal, Message: why})
	}
}

// accept returns l's next connection, retrying every error, until ctx
// ends (or l is closed): then it returns ctx's error. A connection taken
// with the spare descriptor is answered and closed here (its hello with
// an error, on the socket; nothing on TCP, whose peer has not yet said
// who it is).
func (s *Server) accept(ctx context.Context, l net.Listener, isUnix bool) (net.Conn, error) {
	pause := time.Duration(0)
	for {
		c, err := l.Accept()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if outOfFDs(err) && s.spare.give() {
			if c, err := l.Accept(); err == nil {
				slog.Warn("out of file descriptors: refusing a connection", "limit", fdLimit())
				if isUnix {
					refuseHello(c, fdAdvice())
				}
				c.Close()
			}
			s.spare.keep()
		}
		pause = min(max(2*pause, acceptPauseMin), acceptPauseMax)
		slog.Warn("accept failed; trying again", "err", err, "in", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
