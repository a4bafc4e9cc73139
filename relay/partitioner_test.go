package relay

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/IBM/sarama"
)

// murmur2 is Kafka's Utils.murmur2 (the Java client's key hash), written
// from its reference formula so the test does not trust sarama's copy.
func murmur2(data []byte) int32 {
	const (
		seed = uint32(0x9747b28c)
		m    = uint32(0x5bd1e995)
		r    = 24
	)
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[length&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// javaPartition is the Java client's partition for a key:
// toPositive(murmur2(key)) % numPartitions.
func javaPartition(key []byte, partitions int32) int32 {
	return (murmur2(key) & 0x7fffffff) % partitions
}

// kafkaMurmur2 holds the vectors of Kafka's own UtilsTest.testMurmur2, then
// those akka's Murmur2Spec checks against Kafka's implementation.
var kafkaMurmur2 = []struct {
	key  []byte
	hash int32
}{
	{[]byte("21"), -973932308},
	{[]byte("foobar"), -790332482},
	{[]byte("a-little-bit-long-string"), -985981536},
	{[]byte("a-little-bit-longer-string"), -1486304829},
	{[]byte("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58897971},
	{[]byte{'a', 'b', 'c'}, 479470107},
	{[]byte("1"), -1993445489},
	{[]byte("12"), 126087238},
	{[]byte("123"), -267702483},
	{[]byte("1234"), -1614185708},
	{[]byte("12345"), -1188365604},
}

func TestMurmur2_KafkaVectors(t *testing.T) {
	for _, v := range kafkaMurmur2 {
		if got := murmur2(v.key); got != v.hash {
			t.Errorf("murmur2(%q) = %d, Kafka says %d", v.key, got, v.hash)
		}
	}
}

// TestPartitioner_JavaParity checks the producer's partitioner against the
// Java client's formula applied to Kafka's published hashes, then against
// the reference murmur2 on random keys.
func TestPartitioner_JavaParity(t *testing.T) {
	counts := []int32{1, 2, 3, 7, 10, 16, 100}
	for _, n := range counts {
		for _, v := range kafkaMurmur2 {
			want := (v.hash & 0x7fffffff) % n
			if got := saramaPartition(t, v.key, n); got != want {
				t.Errorf("key %q over %d partitions: got %d, Java client %d", v.key, n, got, want)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		key := make([]byte, rng.IntN(40))
		for i := range key {
			key[i] = byte(rng.UintN(256))
		}
		n := counts[rng.IntN(len(counts))]
		if got, want := saramaPartition(t, key, n), javaPartition(key, n); got != want {
			t.Fatalf("key %x over %d partitions: got %d, Java client %d", key, n, got, want)
		}
	}
	// The progress reader looks where the producer writes.
	for _, n := range counts {
		for _, v := range kafkaMurmur2 {
			got, err := partitionFor("p", string(v.key), int(n))
			if err != nil || got != (v.hash&0x7fffffff)%n {
				t.Errorf("partitionFor(%q, %d) = %d, %v", v.key, n, got, err)
			}
		}
	}
}

func saramaPartition(t *testing.T, key []byte, n int32) int32 {
	t.Helper()
	p := saramaConfig(DefaultConfig(), "").Producer.Partitioner("topic")
	got, err := p.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(key)}, n)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func ExampleProgress() {
	p, _ := DecodeProgress([]byte(`{"lastId":42,"feed":"orders","partition":0,"epoch":"e1","position":4096,"n":0}`))
	fmt.Println(p.LastID, p.Feed, p.Position)
	// Output: 42 orders 4096
}
