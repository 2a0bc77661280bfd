package tasks

import "sync"

// batcher hands what concurrent callers submit to flush in batches of at
// most max, in the order they came, and returns to each caller once its
// batch is flushed. Writers (at most writers at once) exist only while
// work waits: a submit that finds fewer at work starts one, and a writer
// that finds nothing waiting ends. Under load, what arrives while a batch
// is flushed goes in the next one; alone, a call goes at once.
type batcher[T any] struct {
	max, writers int
	flush        func([]T)

	mu     sync.Mutex
	queue  []batchItem[T]
	active int
}

type batchItem[T any] struct {
	v    T
	done chan struct{}
}

// do submits v and waits until its batch is flushed.
func (b *batcher[T]) do(v T) {
	it := batchItem[T]{v: v, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, it)
	spawn := b.active < b.writers
	if spawn {
		b.active++
	}
	b.mu.Unlock()
	if spawn {
		go b.write()
	}
	<-it.done
}

func (b *batcher[T]) write() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		if n == 0 {
			b.active--
			b.mu.Unlock()
			return
		}
		items := append([]batchItem[T](nil), b.queue[:n]...)
		clear(b.queue[:n])
		b.queue = b.queue[n:]
		b.mu.Unlock()

		vs := make([]T, n)
		for i, it := range items {
			vs[i] = it.v
		}
		b.flush(vs)
		for _, it := range items {
			close(it.done)
		}
	}
}
