#!/bin/bash
printf 'Hello, Harness!\n' > /app/greeting.txt
