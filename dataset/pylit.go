package dataset

import (
	"fmt"
	"strconv"
	"strings"
)

// pyValue is a Python literal as numpy writes them in .npy headers: a
// string, an integer, a name (True, False, None), or a list or tuple.
type pyValue struct {
	str   *string
	num   *int64
	name  string
	items []pyValue
	tuple bool
	list  bool
}

// parsePyLiteral reads one Python literal (a structured dtype's descr:
// lists of tuples of strings, nested lists and shape tuples), with a
// depth and size bound, as ast.literal_eval would for what numpy writes.
func parsePyLiteral(s string) (pyValue, error) {
	p := &pyParser{s: s}
	v, err := p.value(0)
	if err != nil {
		return v, err
	}
	p.space()
	if p.i != len(p.s) {
		return v, fmt.Errorf("text after the literal at %q: %w", trunc(p.s[p.i:]), ErrCorrupt)
	}
	return v, nil
}

type pyParser struct {
	s string
	i int
}

func (p *pyParser) space() {
	for p.i < len(p.s) && strings.IndexByte(" \t\n\r", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *pyParser) value(depth int) (pyValue, error) {
	if depth > 32 {
		return pyValue{}, fmt.Errorf("literal nested more than 32 deep: %w", ErrCorrupt)
	}
	p.space()
	if p.i >= len(p.s) {
		return pyValue{}, fmt.Errorf("literal ends early: %w", ErrCorrupt)
	}
	switch c := p.s[p.i]; {
	case c == '(' || c == '[':
		closer := byte(')')
		if c == '[' {
			closer = ']'
		}
		p.i++
		v := pyValue{tuple: c == '(', list: c == '['}
		for {
			p.space()
			if p.i < len(p.s) && p.s[p.i] == closer {
				p.i++
				return v, nil
			}
			if len(v.items) > 1<<16 {
				return v, fmt.Errorf("literal of more than 65536 items: %w", ErrCorrupt)
			}
			it, err := p.value(depth + 1)
			if err != nil {
				return v, err
			}
			v.items = append(v.items, it)
			p.space()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i >= len(p.s) || p.s[p.i] != closer {
				return v, fmt.Errorf("literal: want %q at %q: %w", closer, trunc(p.s[min(p.i, len(p.s)):]), ErrCorrupt)
			}
		}
	case c == '\'' || c == '"':
		var b strings.Builder
		for p.i++; p.i < len(p.s); p.i++ {
			switch ch := p.s[p.i]; ch {
			case c:
				p.i++
				s := b.String()
				return pyValue{str: &s}, nil
			case '\\':
				if p.i+1 >= len(p.s) {
					return pyValue{}, fmt.Errorf("literal: string ends in a backslash: %w", ErrCorrupt)
				}
				p.i++
				switch e := p.s[p.i]; e {
				case 'n':
					b.WriteByte('\n')
				case 't':
					b.WriteByte('\t')
				case 'x':
					if p.i+2 >= len(p.s) {
						return pyValue{}, fmt.Errorf("literal: short \\x escape: %w", ErrCorrupt)
					}
					n, err := strconv.ParseUint(p.s[p.i+1:p.i+3], 16, 8)
					if err != nil {
						return pyValue{}, fmt.Errorf("literal: \\x escape: %w", ErrCorrupt)
					}
					b.WriteRune(rune(n))
					p.i += 2
				default:
					b.WriteByte(e)
				}
			default:
				b.WriteByte(ch)
			}
		}
		return pyValue{}, fmt.Errorf("literal: unterminated string: %w", ErrCorrupt)
	case c == '-' || c >= '0' && c <= '9':
		j := p.i + 1
		for j < len(p.s) && (p.s[j] >= '0' && p.s[j] <= '9' || p.s[j] == 'L') {
			j++
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(p.s[p.i:j], "L"), 10, 64)
		if err != nil {
			return pyValue{}, fmt.Errorf("literal: number %q: %w", p.s[p.i:j], ErrCorrupt)
		}
		p.i = j
		return pyValue{num: &n}, nil
	default:
		j := p.i
		for j < len(p.s) && (p.s[j] == '_' || p.s[j] >= 'a' && p.s[j] <= 'z' || p.s[j] >= 'A' && p.s[j] <= 'Z') {
			j++
		}
		if j == p.i {
			return pyValue{}, fmt.Errorf("literal: unexpected %q: %w", c, ErrCorrupt)
		}
		v := pyValue{name: p.s[p.i:j]}
		p.i = j
		return v, nil
	}
}

// descrSize is the item size of a numpy descr: a dtype string, or a
// structured dtype's list of (name, dtype[, shape]) fields, padding
// fields included, as dtype.descr writes them.
func descrSize(v pyValue, depth int) (int, error) {
	if v.str != nil {
		return dtypeSize(*v.str)
	}
	if !v.list || depth > 32 {
		return 0, fmt.Errorf("dtype descr is neither a dtype string nor a list of fields: %w", ErrUnsupported)
	}
	total := 0
	for _, f := range v.items {
		if !f.tuple || len(f.items) < 2 || len(f.items) > 3 {
			return 0, fmt.Errorf("structured dtype field is not (name, dtype[, shape]): %w", ErrCorrupt)
		}
		name := f.items[0]
		if name.str == nil && !(name.tuple && len(name.items) == 2 && name.items[1].str != nil) {
			return 0, fmt.Errorf("structured dtype field name is not a string or (title, name): %w", ErrCorrupt)
		}
		size, err := descrSize(f.items[1], depth+1)
		if err != nil {
			return 0, err
		}
		if len(f.items) == 3 {
			shape := f.items[2]
			dims := shape.items
			if shape.num != nil {
				dims = []pyValue{shape}
			} else if !shape.tuple {
				return 0, fmt.Errorf("structured dtype field shape is not a tuple: %w", ErrCorrupt)
			}
			for _, d := range dims {
				if d.num == nil || *d.num < 0 || *d.num > 1<<30 {
					return 0, fmt.Errorf("structured dtype field shape: %w", ErrCorrupt)
				}
				size *= int(*d.num)
				if size > 1<<30 {
					return 0, fmt.Errorf("structured dtype of more than 1 GiB per item: %w", ErrUnsupported)
				}
			}
		}
		total += size
		if total > 1<<30 {
			return 0, fmt.Errorf("structured dtype of more than 1 GiB per item: %w", ErrUnsupported)
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("structured dtype of no bytes: %w", ErrUnsupported)
	}
	return total, nil
}
