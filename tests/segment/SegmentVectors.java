// Writes segment-append commands with java.io.DataOutputStream, the way Pravega's
// WireCommands do, for test_java_parity.py to compare with protocols.segment.
//
// Output: one line per command, "name hex". Then, for every line of standard input
// (a string as UTF-16BE hex, possibly empty), one line "utf hex" with writeUTF's bytes.

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.UUID;

public final class SegmentVectors {
    static final UUID WRITER = UUID.fromString("00112233-4455-6677-8899-aabbccddeeff");
    static final String SEGMENT = "scope/stream/0.#epoch.0";

    interface Body {
        void write(DataOutputStream out) throws IOException;
    }

    static byte[] command(int type, Body body) throws IOException {
        ByteArrayOutputStream fields = new ByteArrayOutputStream();
        body.write(new DataOutputStream(fields));
        ByteArrayOutputStream whole = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(whole);
        out.writeInt(type);
        out.writeInt(fields.size());
        fields.writeTo(out);
        return whole.toByteArray();
    }

    static void uuid(DataOutputStream out, UUID id) throws IOException {
        out.writeLong(id.getMostSignificantBits());
        out.writeLong(id.getLeastSignificantBits());
    }

    static byte[] event(String text) throws IOException {
        byte[] data = text.getBytes(StandardCharsets.US_ASCII);
        return command(0, out -> out.write(data));
    }

    /** An AppendBlock header announcing {@code length} bytes, then the writer id. */
    static byte[] blockHeader(int length) throws IOException {
        ByteArrayOutputStream whole = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(whole);
        out.writeInt(3);
        out.writeInt(length);
        uuid(out, WRITER);
        return whole.toByteArray();
    }

    static byte[] blockEnd(int whole, byte[] data, int numEvents, long last, long requestId)
            throws IOException {
        return command(4, out -> {
            uuid(out, WRITER);
            out.writeInt(whole);
            out.writeInt(data.length);
            out.write(data);
            out.writeInt(numEvents);
            out.writeLong(last);
            out.writeLong(requestId);
        });
    }

    static byte[] concat(byte[]... parts) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (byte[] part : parts) {
            out.write(part, 0, part.length);
        }
        return out.toByteArray();
    }

    static String hex(byte[] data) {
        StringBuilder text = new StringBuilder(data.length * 2);
        for (byte b : data) {
            text.append(String.format("%02x", b & 0xff));
        }
        return text.toString();
    }

    static void print(String name, byte[] data) {
        System.out.println(name + " " + hex(data));
    }

    public static void main(String[] args) throws IOException {
        byte[] ev1 = event("hello");
        byte[] ev2 = event("0123456789abcdefghij");
        print("hello", command(-127, out -> {
            out.writeInt(17);
            out.writeInt(5);
        }));
        print("keepalive", command(100, out -> { }));
        print("setup_append", command(1, out -> {
            out.writeLong(1);
            uuid(out, WRITER);
            out.writeUTF(SEGMENT);
            out.writeUTF("");
        }));
        print("append_setup_new_writer", command(2, out -> {
            out.writeLong(1);
            out.writeUTF(SEGMENT);
            uuid(out, WRITER);
            out.writeLong(Long.MIN_VALUE);
        }));
        print("event_hello", ev1);
        print("append_block_single", concat(blockHeader(16 + ev1.length), ev1));
        print("append_block_end_single", blockEnd(13, new byte[0], 1, 1, 1));
        // A 32-byte block (+8 reserved): ev1, then a PartialEvent with ev2's first 19 bytes.
        byte[] partial = command(-2, out -> out.write(ev2, 0, 19));
        print("batched_block", concat(blockHeader(16 + 32 + 8), ev1, partial));
        byte[] tail = new byte[ev2.length - 19];
        System.arraycopy(ev2, 19, tail, 0, tail.length);
        print("batched_block_end", blockEnd(13, tail, 2, 2, 1));
        byte[] padding = command(-1, out -> {
            for (int i = 0; i < 19 / 8; i++) {
                out.writeLong(0L);
            }
            for (int i = 0; i < 19 % 8; i++) {
                out.writeByte(0);
            }
        });
        print("padded_block", concat(blockHeader(16 + 32 + 8), ev1, padding));
        print("padded_block_end", blockEnd(13, new byte[0], 1, 1, 1));
        print("data_appended", command(7, out -> {
            uuid(out, WRITER);
            out.writeLong(2);
            out.writeLong(Long.MIN_VALUE);
            out.writeLong(1);
            out.writeLong(41);
        }));
        print("read_segment", command(9, out -> {
            out.writeUTF(SEGMENT);
            out.writeLong(0);
            out.writeInt(1024);
            out.writeUTF("");
            out.writeLong(2);
        }));
        byte[] both = concat(ev1, ev2);
        print("segment_read", command(10, out -> {
            out.writeUTF(SEGMENT);
            out.writeLong(0);
            out.writeBoolean(true);
            out.writeBoolean(false);
            out.writeInt(both.length);
            out.write(both);
            out.writeLong(2);
        }));
        print("wrong_host", command(50, out -> {
            out.writeLong(1);
            out.writeUTF(SEGMENT);
            out.writeUTF("10.0.0.2:12345");
            out.writeUTF("");
        }));
        print("no_such_segment", command(53, out -> {
            out.writeLong(1);
            out.writeUTF(SEGMENT);
            out.writeUTF("");
            out.writeLong(-1);
        }));
        print("invalid_event_number", command(55, out -> {
            uuid(out, WRITER);
            out.writeLong(1);
            out.writeUTF("");
            out.writeLong(7);
        }));
        // The replies that have no vector in the research.
        // Pravega's segment info and offset commands, as its WireCommands write them.
        print("get_stream_segment_info", command(11, out -> {
            out.writeLong(9);
            out.writeUTF(SEGMENT);
            out.writeUTF("");
        }));
        print("stream_segment_info", command(12, out -> {
            out.writeLong(9);
            out.writeUTF(SEGMENT);
            out.writeBoolean(true);
            out.writeBoolean(false);
            out.writeBoolean(false);
            out.writeLong(1700000000000L);
            out.writeLong(4096);
            out.writeLong(1024);
        }));
        print("locate_offset", command(41, out -> {
            out.writeLong(10);
            out.writeUTF(SEGMENT);
            out.writeLong(2048);
            out.writeUTF("");
        }));
        print("offset_located", command(42, out -> {
            out.writeLong(10);
            out.writeUTF(SEGMENT);
            out.writeLong(2000);
        }));
        print("segment_is_sealed", command(51, out -> {
            out.writeLong(3);
            out.writeUTF(SEGMENT);
            out.writeUTF("at Store.append");
            out.writeLong(4096);
        }));
        print("segment_already_exists", command(52, out -> {
            out.writeLong(4);
            out.writeUTF(SEGMENT);
            out.writeUTF("");
        }));
        print("segment_is_truncated", command(56, out -> {
            out.writeLong(5);
            out.writeUTF(SEGMENT);
            out.writeLong(1000);
            out.writeUTF("");
            out.writeLong(10);
        }));
        print("operation_unsupported", command(57, out -> {
            out.writeLong(6);
            out.writeUTF("createSegment");
            out.writeUTF("");
        }));
        print("auth_token_check_failed", command(60, out -> {
            out.writeLong(7);
            out.writeUTF("");
            out.writeInt(1);
        }));
        print("error_message", command(61, out -> {
            out.writeLong(8);
            out.writeUTF(SEGMENT);
            out.writeUTF("caf\u00e9 \u0000 \ud83d\ude00");
            out.writeInt(0);
        }));

        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        String line;
        while ((line = in.readLine()) != null) {
            char[] units = new char[line.length() / 4];
            for (int i = 0; i < units.length; i++) {
                units[i] = (char) Integer.parseInt(line.substring(4 * i, 4 * i + 4), 16);
            }
            ByteArrayOutputStream bytes = new ByteArrayOutputStream();
            new DataOutputStream(bytes).writeUTF(new String(units));
            print("utf", bytes.toByteArray());
        }
    }
}
