"""The XSum/T5 summarisation workload of JSC's course, as a ddl plugin."""
