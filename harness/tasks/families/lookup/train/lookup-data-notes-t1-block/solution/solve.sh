#!/bin/bash
cd /app && echo "$(cat data.txt)" > notes.txt
