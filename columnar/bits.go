package columnar

import "math/bits"

// copyBits copies n bits from src at bit so to dst at bit do (LSB first, as
// Arrow numbers bits).
func copyBits(dst []byte, do int64, src []byte, so int64, n int64) {
	if do%8 == 0 && so%8 == 0 {
		full := n / 8
		copy(dst[do/8:do/8+full], src[so/8:so/8+full])
		do, so, n = do+full*8, so+full*8, n-full*8
	}
	for i := int64(0); i < n; i++ {
		s, d := so+i, do+i
		if src[s>>3]&(1<<(s&7)) != 0 {
			dst[d>>3] |= 1 << (d & 7)
		} else {
			dst[d>>3] &^= 1 << (d & 7)
		}
	}
}

// fillBits sets n bits of dst from bit at.
func fillBits(dst []byte, at, n int64) {
	for n > 0 && at%8 != 0 {
		dst[at>>3] |= 1 << (at & 7)
		at, n = at+1, n-1
	}
	for ; n >= 8; at, n = at+8, n-8 {
		dst[at>>3] = 0xff
	}
	for ; n > 0; at, n = at+1, n-1 {
		dst[at>>3] |= 1 << (at & 7)
	}
}

// countZeros counts the unset bits among the first n of b.
func countZeros(b []byte, n int64) int64 {
	set := int64(0)
	full := n / 8
	for _, x := range b[:full] {
		set += int64(bits.OnesCount8(x))
	}
	if r := n % 8; r > 0 {
		set += int64(bits.OnesCount8(b[full] & (1<<r - 1)))
	}
	return n - set
}
