package iptlegacy

// blockList is an append-only list kept in blocks of blockLen elements. The nat decoder's
// lists grow with the table (100,000 endpoint chains at 10,000 Services x 10 endpoints):
// appended to one slice, the arrays it outgrew would add up to about four times its final
// size, garbage that stays on the heap, resident, until the next collection. A blockList
// copies nothing once its first block is full; that block grows as a slice does, so a small
// table costs no more than before.
type blockList[T any] struct {
	blocks [][]T
	n      int
}

const blockLen = 1024

func (l *blockList[T]) add(v T) {
	if len(l.blocks) == 0 || len(l.blocks[len(l.blocks)-1]) == blockLen {
		var b []T
		if len(l.blocks) > 0 {
			b = make([]T, 0, blockLen)
		}
		l.blocks = append(l.blocks, b)
	}
	b := &l.blocks[len(l.blocks)-1]
	*b = append(*b, v)
	l.n++
}

func (l *blockList[T]) len() int { return l.n }

// at returns element i, which the list must have.
func (l *blockList[T]) at(i int) *T { return &l.blocks[i/blockLen][i%blockLen] }

// last returns the latest element added; the list must not be empty.
func (l *blockList[T]) last() *T { return l.at(l.n - 1) }

// all yields the elements in the order they were added.
func (l *blockList[T]) all(yield func(int, *T) bool) {
	i := 0
	for _, b := range l.blocks {
		for j := range b {
			if !yield(i, &b[j]) {
				return
			}
			i++
		}
	}
}
