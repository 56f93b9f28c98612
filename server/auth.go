package server

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Loopback is no trust boundary on a shared machine: any local user can
// connect to a loopback port. So every TCP listener needs a token, made
// here when none is given and written next to the socket, in the
// directory only the daemon's user may enter. Tokens are compared in
// constant time, and failures are slowed for the whole daemon, so guessing
// costs seconds per handful of tries however many connections try.

// newToken returns 32 random bytes in hex.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// writeToken saves the token at path, readable by its owner only.
func writeToken(path, token string) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.WriteString(token + "\n"); err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func tokenOK(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// showPaths says whether an HTTP request may see dataset paths as they
// are (it presents the daemon's token: Authorization: Bearer TOKEN) or
// only their hashes (no Authorization header). A wrong token, or any
// token when the daemon has none, is refused with 401, slowed as a failed
// hello is, and ok is false: the caller has answered and writes nothing.
// /metrics and the live view follow this one rule.
func (s *Server) showPaths(w http.ResponseWriter, r *http.Request) (full, ok bool) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return false, true
	}
	got, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || s.token == "" || !tokenOK(strings.TrimSpace(got), s.token) {
		s.fails.wait()
		http.Error(w, "wrong token", http.StatusUnauthorized)
		return false, false
	}
	return true, true
}

// failures slows down failed handshakes for the whole daemon: each waits
// for a slot of the shared rate, at most failRate per second.
type failures struct {
	mu   sync.Mutex
	next time.Time
}

const failRate = 5

// wait blocks until this failure's turn.
func (f *failures) wait() {
	f.mu.Lock()
	now := time.Now()
	if f.next.Before(now) {
		f.next = now
	}
	f.next = f.next.Add(time.Second / failRate)
	at := f.next
	f.mu.Unlock()
	time.Sleep(time.Until(at))
}

// ErrUnsafeDir says a socket directory is not private to the daemon's user.
var ErrUnsafeDir = errors.New("socket directory is not private to this user")

// privateDir makes dir (mode 0700) if it is missing, and checks that it is
// a directory, not a link, owned by this user and closed to everyone else:
// otherwise another user who made it first could take the socket's place
// and answer for the daemon.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok {
		return fmt.Errorf("%s: %w (not a directory)", dir, ErrUnsafeDir)
	}
	if int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s: %w: owned by uid %d with mode %04o, want uid %d and mode 0700 (remove it, or choose another --socket)",
			dir, ErrUnsafeDir, sys.Uid, st.Mode().Perm(), os.Geteuid())
	}
	return nil
}

// tokenPath is where a generated token is written for a socket.
func tokenPath(socket string) string {
	return filepath.Join(filepath.Dir(socket), filepath.Base(socket)+".token")
}

// Admission. A connection costs the daemon a descriptor and a goroutine
// before it has proved anything, so those that have not said hello are
// bounded on their own, apart from the connections that have: anyone who
// can reach the TCP port can open them, and they must not use up the
// room of the owner's Unix socket or of clients holding the token. Each
// source address may hold 32 (a node's peer pool, 16 connections, and a
// client's ranks and workers may dial at once, and each place is held
// only for the round trip of a hello) and all of them together 128; each
// has helloTimeout to authenticate.
// A flood from one address is then capped at perAddr connections, and
// clients from every other address get in; a flood from many addresses
// fills the pool and can delay TCP clients by at most helloTimeout per
// attempt, never the Unix socket. Once a connection authenticates it
// moves to the authenticated pool (MaxConns).
const (
	maxPreAuth     = 128
	maxPreAuthAddr = 32
)

// preAuth counts the TCP connections that have not authenticated, in all
// and per source address.
type preAuth struct {
	mu      sync.Mutex
	n       int
	byAddr  map[string]int
	max     int
	perAddr int
}

// take admits one more unauthenticated connection from addr, or says no.
func (p *preAuth) take(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n >= p.max || p.byAddr[addr] >= p.perAddr {
		return false
	}
	if p.byAddr == nil {
		p.byAddr = map[string]int{}
	}
	p.n++
	p.byAddr[addr]++
	return true
}

// give returns addr's place: the connection authenticated or ended.
func (p *preAuth) give(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	if p.byAddr[addr]--; p.byAddr[addr] <= 0 {
		delete(p.byAddr, addr)
	}
}

// sourceOf is the address a connection is counted under: its IP (a
// client's ports are many).
func sourceOf(c net.Conn) string {
	a := c.RemoteAddr()
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}
