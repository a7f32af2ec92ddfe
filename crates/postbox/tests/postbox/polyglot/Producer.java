// A Java service writing its business rows and its events in one JDBC transaction, through
// Postbox's SQL API. Driven by crates/postbox/tests/postbox/polyglot.rs: one command per line on stdin,
// one answer per line on stdout (the protocol is described there).
//
// Compile: javac -cp /usr/share/java/postgresql.jar Producer.java
// Run:     java -cp .:/usr/share/java/postgresql.jar Producer 'jdbc:postgresql://127.0.0.1:5432/app?user=postgres'

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;

import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

public final class Producer {
    private static final String PRODUCER = "java";

    // Named arguments: the optional ones can be left out, and the call reads as what it means.
    private static final String ENQUEUE =
        "SELECT postbox_enqueue(event_type => ?, aggregate_type => ?, aggregate_id => ?, "
            + "payload => ?::jsonb, idempotency_key => ?, without_idempotency_key => ?)";
    private static final String ENQUEUE_MANY = "SELECT postbox_enqueue_many(?::jsonb)";
    private static final String BUSINESS_ROW = "INSERT INTO orders (order_id, producer) VALUES (?, ?)";

    private Producer() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: java Producer <jdbc url>");
            System.exit(2);
        }
        try (Connection conn = DriverManager.getConnection(args[0])) {
            // Every command runs in the transaction that `commit` or `rollback` ends.
            conn.setAutoCommit(false);
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String[] words = line.trim().split(" ");
                switch (words[0]) {
                    case "enqueue" -> answer("enqueued " + orNull(enqueue(conn, Long.parseLong(words[1]), words[2])));
                    case "many" -> answer("ids " + enqueueMany(conn, words[1].split(",")));
                    case "invalid" -> answer(invalid(conn));
                    case "commit" -> {
                        conn.commit();
                        answer("committed " + epochMicros());
                    }
                    case "rollback" -> {
                        conn.rollback();
                        answer("rolledback");
                    }
                    case "quit" -> {
                        return;
                    }
                    default -> throw new IllegalArgumentException("unknown command: " + line);
                }
            }
        }
    }

    /** A business row and its event; the event's id, or null for a duplicate. */
    private static Long enqueue(Connection conn, long orderId, String key) throws SQLException {
        try (PreparedStatement row = conn.prepareStatement(BUSINESS_ROW)) {
            row.setLong(1, orderId);
            row.setString(2, PRODUCER);
            row.executeUpdate();
        }
        try (PreparedStatement call = conn.prepareStatement(ENQUEUE)) {
            call.setString(1, "OrderPlaced");
            call.setString(2, "Order");
            call.setString(3, Long.toString(orderId));
            call.setString(4, "{\"order_id\": " + orderId + ", \"producer\": \"" + PRODUCER + "\"}");
            // "-": the daily key (NULL); "none": no key at all; anything else: that key.
            if (key.equals("-") || key.equals("none")) {
                call.setNull(5, Types.VARCHAR);
            } else {
                call.setString(5, key);
            }
            call.setBoolean(6, key.equals("none"));
            try (ResultSet rs = call.executeQuery()) {
                rs.next();
                long id = rs.getLong(1);
                return rs.wasNull() ? null : id;
            }
        }
    }

    /** One batch of events with the given keys; their ids in order, "null" for duplicates. */
    private static String enqueueMany(Connection conn, String[] keys) throws SQLException {
        StringBuilder json = new StringBuilder("[");
        for (int i = 0; i < keys.length; i++) {
            if (i > 0) {
                json.append(", ");
            }
            json.append("{\"event_type\": \"OrderNoted\", \"payload\": {\"n\": ").append(i)
                .append("}, \"idempotency_key\": \"").append(keys[i]).append("\"}");
        }
        json.append("]");
        try (PreparedStatement call = conn.prepareStatement(ENQUEUE_MANY)) {
            call.setString(1, json.toString());
            try (ResultSet rs = call.executeQuery()) {
                rs.next();
                Array array = rs.getArray(1);
                Long[] ids = (Long[]) array.getArray();
                List<String> out = new ArrayList<>();
                for (Long id : ids) {
                    out.add(orNull(id));
                }
                return String.join(",", out);
            }
        }
    }

    /** An event with an empty type: the error's SQLSTATE and the argument it names. */
    private static String invalid(Connection conn) throws SQLException {
        try (PreparedStatement call = conn.prepareStatement(
                "SELECT postbox_enqueue(?, NULL, NULL, '{}'::jsonb)")) {
            call.setString(1, "");
            call.executeQuery();
            return "error none";
        } catch (PSQLException e) {
            ServerErrorMessage server = e.getServerErrorMessage();
            String column = server == null ? "?" : server.getColumn();
            return "error " + e.getSQLState() + " " + column;
        }
    }

    private static String orNull(Long id) {
        return id == null ? "null" : id.toString();
    }

    private static long epochMicros() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000L;
    }

    private static void answer(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
